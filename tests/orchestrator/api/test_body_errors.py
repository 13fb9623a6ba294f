"""The OpenAI API's answers to bodies it cannot take: a 400 in OpenAI's shape whose `param` names a field, never a
byte offset; unknown fields are accepted and named in a warning, as vLLM does."""

import asyncio
import logging

import pytest
from fastapi.testclient import TestClient

from services.common.config import Limits
from services.orchestrator.api.body_errors import field_at
from services.orchestrator.api.openai_api import APIError, api, open_job
from services.orchestrator.api.openai_protocol import CompletionRequest


@pytest.mark.parametrize(
    "doc, field",
    [
        ('{"model": "dlm", "max_tokens": 3,}', "max_tokens"),
        ('{"model": "dlm", "temperature": 0.,}', "temperature"),
        ('{"model": "dlm", "stream_options": {"include_usage": tru}}', "stream_options"),
        ('{"prompt": "a \\"quoted\\": word", "stop": [1, }', "stop"),
        ("{", None),
    ],
)
def test_a_malformed_body_names_the_field_it_broke_in(doc, field):
    assert field_at(doc, len(doc) - 1) == field


def test_malformed_json_is_a_400_naming_the_field():
    body = b'{"model": "dlm", "prompt": "sort: 5 3 9 1 7", "max_tokens": 3,}'
    reply = TestClient(api).post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 400
    err = reply.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "max_tokens"
    assert "not valid JSON in field 'max_tokens'" in err["message"]


def test_an_unknown_field_is_accepted_and_named_in_a_warning(caplog):
    body = CompletionRequest(model="dlm", prompt="x", max_tokens=10**6, min_tokens=2, ignore_eos=True)
    assert body.model_extra == {"min_tokens": 2, "ignore_eos": True}
    with caplog.at_level(logging.WARNING), pytest.raises(APIError, match="max_tokens"):  # refused later, for size
        asyncio.run(open_job(None, Limits(), body, [1], None, body.max_tokens, "cmpl"))
    [record] = [r for r in caplog.records if "ignored unknown fields" in r.getMessage()]
    assert "['ignore_eos', 'min_tokens']" in record.getMessage()
