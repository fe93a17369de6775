"""The exit codes of the `warmstart` command, in one place for cli.py and the engine commands."""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
# The engine commands' own outcomes (warmstart/automation/, docs/ci-and-policies.md).
EXIT_CHANGES = 3  # --expect-no-changes, and the stack would change (drift)
EXIT_PREREQUISITES = 4  # Pulumi CLI, plugins, Python env, AWS credentials, backend or passphrase missing
# An EC2 vCPU quota below what the GPU pools need (automation/quotas.py): a prerequisite of the
# account, found before any engine call, so it shares the prerequisites' code.
EXIT_QUOTA = EXIT_PREREQUISITES
EXIT_POLICY = 5  # the policy pack blocked the preview or update (a mandatory violation)
# A model's weights are not ready to stream (missing files, a size unlike weightsGiB, a bucket
# the stack would create empty or cannot read): found by preflight.py before any engine call.
EXIT_PREFLIGHT = 6
# `warmstart drill`: the run finished and restored, and a line of its report failed (measured past
# its prediction's tolerance, a failed request, no replica added): distinct from EXIT_FAILED, a run
# that could not be made.
EXIT_DRILL_FAILED = 7
