"""Per-request treespec options (engine/request_options.py): parsing and the admission check."""
from __future__ import annotations

import pytest

from vllm_treespec.engine.request_options import (RequestOptionError, RequestOptions,
                                                  parse_request_options)


def test_absent_or_null_options_keep_the_deployment_budget():
    assert parse_request_options(None) == RequestOptions()
    assert parse_request_options({"other_plugin": 1}) == RequestOptions()
    assert parse_request_options({"treespec": None}) == RequestOptions()
    assert parse_request_options({"treespec": {}}) == RequestOptions()


def test_max_nodes_is_read():
    assert parse_request_options({"treespec": {"max_nodes": 0}}).max_nodes == 0
    assert parse_request_options({"treespec": {"max_nodes": 5}}).max_nodes == 5


@pytest.mark.parametrize("value, key", [
    ({"max_nodes": -1}, "treespec.max_nodes"),
    ({"max_nodes": "8"}, "treespec.max_nodes"),
    ({"max_nodes": 2.5}, "treespec.max_nodes"),
    ({"max_nodes": True}, "treespec.max_nodes"),
    ({"max_node": 3}, "treespec.max_node"),
    ([1, 2], "extra_args.treespec"),
    ("off", "extra_args.treespec"),
])
def test_bad_options_name_the_key(value, key):
    with pytest.raises(RequestOptionError, match=key.replace(".", r"\.")):
        parse_request_options({"treespec": value})


def test_sampling_params_reject_bad_options_with_a_validation_error():
    """The check runs where vLLM checks extra_args, so the API server answers 400."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    from vllm_treespec.engine.request_options import install

    install()
    SamplingParams(max_tokens=4, extra_args={"treespec": {"max_nodes": 0}})
    with pytest.raises(VLLMValidationError, match=r"extra_args\.treespec\.max_nodes"):
        SamplingParams(max_tokens=4, extra_args={"treespec": {"max_nodes": -3}})


def test_treespec_options_alone_do_not_block_drafting():
    """Other extra_args feed logits processors (the request decodes without drafts); ours do not."""
    from types import SimpleNamespace

    from vllm_treespec.engine.eligibility import static_blocker

    def params(extra):
        return SimpleNamespace(extra_args=extra)

    assert static_blocker(params({"treespec": {"max_nodes": 2}})) is None
    assert static_blocker(params({"treespec": {}, "my_processor": 1})) == "logits_processor_args"
