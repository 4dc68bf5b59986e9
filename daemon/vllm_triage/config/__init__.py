"""The user's settings: the schema (``schema``), where the values come from and how an
error is explained (``load``), label matchers (``matchers``) and the request headers an
auth section makes (``auth``). Read whole only by the assembly (``vllm_triage.assemble``)."""
