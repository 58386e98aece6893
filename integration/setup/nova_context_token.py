"""A paste filter for the integration tier's nova-api (no Keystone).

Nova's noauth2 middleware builds the request context from ``X-Auth-Token`` (``user:project``)
but leaves the context without a token, so nova-api and, through RPC, nova-compute have none to
send to glance and neutron on the user's behalf ("No valid authentication is available").  This
filter, placed after noauth2, puts the request's token on the context.  Set-up only: it is
never part of vireo.
"""


class ContextToken(object):
    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        ctx = environ.get('nova.context')
        token = environ.get('HTTP_X_AUTH_TOKEN')
        if ctx is not None and token and not ctx.auth_token:
            ctx.auth_token = token
        return self.app(environ, start_response)


def filter_factory(global_conf, **local_conf):
    return ContextToken
