"""Hypothesis strategies shaped like the config's own constraints (DNS labels; prefix <= 20,
model <= 40)."""

from __future__ import annotations

import re

from hypothesis import strategies as st

from warmstart.config import DNS_LABEL

def dns_label(max_size: int) -> st.SearchStrategy[str]:
    return st.from_regex(re.compile(DNS_LABEL[:-1] + r"\Z"), fullmatch=True).filter(lambda s: len(s) <= max_size)


prefixes = dns_label(20)
models = dns_label(40)
