"""Standby actuator: wakes a sleeping vLLM engine on load, puts the idlest back to sleep (stdlib only).

The entry point is `__main__` (`python3 <folder>/standby.pyz`); the work is in `main`."""
