"""Several worker processes behind one port (``AOQ_WORKERS``): the state they share
and the supervisor that starts and replaces them (docs/serving.md, Workers)."""
