"""Per-request treespec options (engine/request_options.py): parsing and the admission check."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_treespec.engine.request_options import (RequestOptionError, RequestOptions,
                                                  parse_request_options)


def test_absent_options_keep_the_deployment_budget():
    assert parse_request_options(None) == RequestOptions()
    assert parse_request_options({"other_plugin": 1}) == RequestOptions()
    assert parse_request_options({"treespec_max_nodes": None}) == RequestOptions()


def test_max_nodes_is_read():
    assert parse_request_options({"treespec_max_nodes": 0}).max_nodes == 0
    assert parse_request_options({"treespec_max_nodes": 5, "other": "x"}).max_nodes == 5


@pytest.mark.parametrize("extra, key", [
    ({"treespec_max_nodes": -1}, "extra_args.treespec_max_nodes"),
    ({"treespec_max_nodes": "8"}, "extra_args.treespec_max_nodes"),
    ({"treespec_max_nodes": 2.5}, "extra_args.treespec_max_nodes"),
    ({"treespec_max_nodes": True}, "extra_args.treespec_max_nodes"),
    ({"treespec_max_node": 3}, "extra_args.treespec_max_node"),
])
def test_bad_options_name_the_key(extra, key):
    with pytest.raises(RequestOptionError, match=key.replace(".", r"\.")):
        parse_request_options(extra)


def test_sampling_params_reject_bad_options_with_a_validation_error():
    """The check runs where vLLM checks extra_args, so the API server answers 400."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    from vllm_treespec.engine.request_options import install

    install()
    SamplingParams(max_tokens=4, extra_args={"treespec_max_nodes": 0})
    with pytest.raises(VLLMValidationError, match=r"extra_args\.treespec_max_nodes"):
        SamplingParams(max_tokens=4, extra_args={"treespec_max_nodes": -3})


def test_treespec_options_alone_do_not_block_drafting():
    """Other extra_args feed logits processors (the request decodes without drafts); ours do not."""
    from vllm_treespec.engine.eligibility import static_blocker

    def params(extra):
        return SimpleNamespace(extra_args=extra)

    assert static_blocker(params({"treespec_max_nodes": 2})) is None
    assert static_blocker(params({"treespec_max_nodes": 2, "my_processor": 1})) == "logits_processor_args"
