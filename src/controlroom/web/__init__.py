"""The operator console (``/``) and the offline API docs (``/docs``): Jinja2 templates,
htmx and Swagger UI served from this package (``static/vendor/README.md``)."""

from controlroom.web.console import install_console

__all__ = ["install_console"]
