"""What the service keeps and reads back: the catalogue (``db``: its schema on SQLite or
PostgreSQL; ``catalogue``: its reads and writes; ``integrity``: the start-up check), the query log
written off the request path (``querylog``), and the gallery's image files (``images``)."""
