"""``python -m controlroom``: the ``controlroom`` command (``controlroom demo run`` starts
its helpers this way, with the interpreter it runs on)."""

from controlroom.cli import app

app(prog_name="controlroom")
