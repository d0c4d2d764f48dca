"""The admin listener: JSON API, metrics, health (and the dashboard)."""

from __future__ import annotations

from aiohttp import web

from relay.admin.api import add_routes, api_guard
from relay.admin.dashboard import add_dashboard
from relay.admin.operator import OPERATOR, Operator
from relay.admin.origin import origin_guard
from relay.admin.throttle import AUTH_FAILURES, AuthFailures


def admin_application(operator: Operator) -> web.Application:
    # The origin guard comes first: it applies to every route, present and future.
    app = web.Application(middlewares=[origin_guard, api_guard], client_max_size=1024 * 1024)
    app[OPERATOR] = operator
    app[AUTH_FAILURES] = AuthFailures()
    add_routes(app)
    add_dashboard(app, operator)
    return app


__all__ = ["OPERATOR", "Operator", "admin_application"]
