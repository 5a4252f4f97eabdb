"""The search service (installed as ``aoq_serve``): FastAPI over a catalogue and FAISS indexes.

    index/    the build stage (``aoq index``): embed a gallery with each checkpoint, write the
              FAISS index artefacts, the evaluation reports and the ground-truth ranks
    store/    the catalogue (SQLAlchemy): its schema, reads and writes, the start-up check
    app.py    the application: settings, the model registry, the routers (``routes/``)
    ...       what a request does: featurise the query, search, negatives, failures, images

It imports the core library (``aoq``), never the training app; ``schemas.py`` is the REST
contract the UI reads.
"""
