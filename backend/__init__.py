"""The search service (installed as ``aoq_serve``): FastAPI over a catalogue and FAISS indexes.

    index/    the build stage (``aoq index``): embed a gallery with each checkpoint, write the
              FAISS index artefacts, the evaluation reports and the ground-truth ranks
    store/    what the service keeps: the catalogue (SQLAlchemy), the query log, image files
    search/   what a request computes: queries to vectors, the two searches, the correct
              answers, micro-batching, hard negatives, failure cases
    guards/   what a request must pass: Host names, body caps, admin access, path confinement,
              parts disabled after a fault
    routes/   the API's routers, one module per group of endpoints
    app.py    the application: settings (``config``), the model registry (``registry``), what
              routes receive (``deps``), the one request error (``errors``); ``server.py`` the
              listening socket and uvicorn's protocol with its guards

It imports the core library (``aoq``), never the training app; ``schemas.py`` is the REST
contract the UI reads.
"""
