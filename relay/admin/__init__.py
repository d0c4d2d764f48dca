"""The admin listener: three parts, each with its own rules.

- the probes (/healthz, /readyz, /metrics): open;
- the JSON API, a sub-application at /api: the bearer token on every call
  (its middleware), and nothing else is a key there;
- the dashboard, every other path: each page behind a signed-in session and
  a CSRF token on every form (its `signed_in` wrapper); no bearer token is a
  key there.

The origin guard, on the listener itself, applies to all three.
"""

from __future__ import annotations

from aiohttp import web

from relay.admin.api import api_application
from relay.admin.console import CONSOLE, Console
from relay.admin.dashboard import add_dashboard
from relay.admin.origin import origin_guard
from relay.admin.probes import add_probes
from relay.admin.throttle import AUTH_FAILURES, AuthFailures


def admin_application(console: Console) -> web.Application:
    # The origin guard comes first: it applies to every route, present and future.
    app = web.Application(middlewares=[origin_guard], client_max_size=1024 * 1024)
    app[CONSOLE] = console
    # One count of failed tries per address, whether a bearer token or a sign-in.
    app[AUTH_FAILURES] = AuthFailures()
    add_probes(app)
    app.add_subapp("/api", api_application())
    add_dashboard(app, console)  # last: it answers every path the others do not
    return app


__all__ = ["CONSOLE", "Console", "admin_application"]
