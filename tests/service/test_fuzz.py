"""Property-based fuzzing of the API from its own OpenAPI document (schemathesis 4): valid
and invalid requests for every operation, sent to a real server as a principal the
operation admits. No answer may be a 5xx, and every status must be one the document lists.

A CI-sized run sends ``FUZZ_EXAMPLES`` (25) requests per operation and generation mode
(positive, negative) where hypothesis can make that many distinct ones, at least 1,000 in
all; ``POSTROOM_FUZZ_EXAMPLES=500`` makes a bigger run.
"""

from __future__ import annotations

import os

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from postroom.http.app import ROUTES
from postroom.http.routing import openapi
from tests.service.conftest import PRINCIPALS

FUZZ_EXAMPLES = int(os.environ.get("POSTROOM_FUZZ_EXAMPLES", "25"))
SCHEMA = schemathesis.openapi.from_dict(openapi(ROUTES, title="postroom", version="test"))
#: A principal of each role, to send each operation as one it admits.
BY_ROLE = {role: name for name, (role, _) in reversed(PRINCIPALS.items())}


def fuzz(service, operation: schemathesis.APIOperation, mode: GenerationMode,
         sent: list[int], failures: list[str]) -> None:
    """Send ``FUZZ_EXAMPLES`` generated requests of ``operation`` and note what came back."""
    roles = operation.definition.raw.get("x-roles")
    headers = {} if roles is None else {
        "authorization": f"Bearer {service.tokens[BY_ROLE[roles[0]]]}"}
    documented = set(operation.definition.raw["responses"])

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def send(case: schemathesis.Case) -> None:
        response = case.call(base_url=service.url, headers=headers, timeout=30)
        sent.append(response.status_code)
        if response.status_code >= 500 or str(response.status_code) not in documented:
            failures.append(f"{operation.label} {mode.value}: {response.status_code} "
                            f"{response.text[:200]} <- {case.path_parameters} "
                            f"{case.query} {str(case.body)[:200]}")

    try:
        send()
    except Unsatisfiable:  # an operation with nothing to send wrong has no negatives
        assert mode is GenerationMode.NEGATIVE, operation.label


def test_no_generated_request_gets_a_5xx_or_an_undocumented_status(service):
    sent: list[int] = []
    failures: list[str] = []
    for result in SCHEMA.get_all_operations():
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(service, result.ok(), mode, sent, failures)
    print(f"fuzzing: {len(sent)} requests, {sum(code >= 500 for code in sent)} 5xx")
    assert failures == []
    assert len(sent) >= 1000
