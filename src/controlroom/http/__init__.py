"""What both HTTP faces, the API (``controlroom.api``) and the console
(``controlroom.web``), stand on: who is calling (``auth``: principals, roles, tokens) and
how a failed message's stored body is answered (``bodies``). Neither face imports the
other; what they share lives here, below both."""
