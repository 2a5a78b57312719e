"""Alembic's environment (``env.py``), the migrations (``versions/``) and what they share
(``_dialects``). The migrations are frozen: each holds its own copy of any logic it runs
and imports only ``sqlalchemy``, ``alembic`` and this package, so that changing feature
code never changes what an old migration does to a new database."""
