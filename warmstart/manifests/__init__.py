"""Kubernetes objects as plain dicts, built from decisions (pure; no Pulumi).

The components in the top-level `components/` register these; the tests validate them
against the Kubernetes and CRD schemas, and the policy pack re-checks them.
"""
