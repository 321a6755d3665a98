"""The serving service: the long-running owner of a host's servers and routers, steered over an admin API."""
