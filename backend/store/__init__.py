"""The catalogue: its schema (SQLite or PostgreSQL), reads and writes, and the start-up check."""
