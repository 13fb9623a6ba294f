"""The Learn2PD filter's architecture and size as 004 §4 fixes them."""

from torch import nn

from services.filter.model import FilterConfig, Learn2PDFilter


def test_default_filter_is_the_papers_two_layer_mlp_of_2112_parameters():
    model = Learn2PDFilter(FilterConfig())
    assert [type(m) for m in model.mlp] == [nn.Linear, nn.ReLU, nn.Linear]
    assert model.config.block_size == 32
    assert sum(p.numel() for p in model.parameters()) == 2112
