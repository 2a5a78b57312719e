"""The relational store: engine, Core tables, migrations, provider registry."""
