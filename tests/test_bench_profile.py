"""The engine profile's op groups (`make bench-profile`)."""

from dcoco.bench.profile import group_of


def test_ops_group_by_their_bare_name_whatever_their_namespace() -> None:
    assert group_of("aten::_weight_int4pack_mm_for_cpu") == "matmul (weights)"
    # oneDNN's linear over packed bf16 weights is a weight matmul too, not "other"
    assert group_of("mkldnn::_linear_pointwise") == "matmul (weights)"
    assert group_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert group_of("dcoco::packed_linear") == "other"  # the wrapper: its kernel counts above
    assert group_of("aten::not_an_op") == "other"


def test_compiled_graphs_and_their_dispatch_form_a_group() -> None:
    assert group_of("## Call CompiledFxGraph fncucz6rwsjdavzj ##") == "compiled graphs"
    assert group_of("TorchDynamo Cache Lookup") == "compiled graphs"
    assert group_of("Torch-Compiled Region: 0/1") == "compiled graphs"
