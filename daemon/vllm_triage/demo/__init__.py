"""The built-in demo: ``offline`` (virtual time, no sockets), ``live`` (the simulator, the
daemon and a webhook receiver over real sockets), ``view`` (the live terminal view) and
``sink`` (the local webhook receiver)."""
