"""The two rounds as one command: hashed, resumable stages (round 1 -> mine -> round 2 ->
published models -> comparison) and the arms a pipeline trains beside its baseline."""
