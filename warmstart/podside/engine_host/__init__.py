"""Engine host supervisor: one vLLM engine per pooled model in one container, started one at a time,
each kept asleep, restarted alone, their health folded into one (stdlib only).

The entry point is `__main__` (`python3 -m warmstart.podside.engine_host` or its zipapp); the work is
in `supervisor` (the engines' lifecycle) and `server` (the folded health, the status and the
actuator's per-engine routes)."""
