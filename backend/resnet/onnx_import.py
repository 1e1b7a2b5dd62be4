"""ResNet-18 weights from an ONNX file, as a torchvision ``state_dict``.

    state = state_dict_from_onnx("resnet18.onnx")   # keys: conv1.weight, bn1.running_var, ..., fc.bias

Reads the graph that ``torch.onnx.export`` writes for torchvision's ``resnet18``
(opset 13 and later): Conv [-> BatchNormalization] -> Relu -> MaxPool, eight
BasicBlocks (Conv, Relu, Conv, Add, Relu, with a 1x1 Conv on the shortcut of
the first block of stages 2-4), GlobalAveragePool -> Flatten -> Gemm (the
TorchScript exporter, ``dynamo=False``) or ReduceMean -> Reshape -> Gemm (the
dynamo exporter, torch's default, which needs onnxscript).

The initialiser names carry no meaning (an eval-mode export folds each
BatchNorm into its convolution and names the results ``onnx::Conv_193``), so
the graph is walked from its input along that structure and each initialiser
is identified by where it is used. Every convolution's kernel, stride and
padding, the max-pool, the head and every shape are checked against
ResNet-18; anything else (a missing initialiser, a wrong shape, an operator
ResNet-18 does not have, a node off the walk) raises `OnnxImportError` naming
the node and what was expected.

Folded or not, the result is a torchvision state dict:
- Conv followed by BatchNormalization: the four BatchNorm tensors as they
  are (a Conv bias, where present, moves into the running mean; an epsilon
  other than torchvision's into the running variance);
- Conv with a bias and no BatchNormalization (BatchNorm folded by the
  exporter): an identity BatchNorm carrying the bias (gamma 1, beta = bias,
  mean 0, var 1 - eps), which the custom engine's folding turns back into
  the same convolution.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .architecture import STAGE_CHANNELS, ResNet18
from .folding import MAXPOOL_KERNEL, MAXPOOL_PADDING, MAXPOOL_STRIDE, STEM, ConvSpec, resnet18_blocks

MIN_OPSET = 13
GRAPH_OPS = ("Conv", "BatchNormalization", "Relu", "MaxPool", "Add", "GlobalAveragePool", "ReduceMean", "Flatten",
             "Reshape", "Gemm", "Identity")
VALUE_OPS = ("Constant",)   # hold initialiser-like values, not part of the walk
BATCHNORM_EPS = 1e-5        # torch.nn.BatchNorm2d's default, what the state dict implies


class OnnxImportError(ValueError):
    """The ONNX file is not a ResNet-18 this importer understands; the message says where and why."""


def state_dict_keys(spec: ConvSpec) -> tuple[str, str]:
    """(convolution weight key, BatchNorm prefix) of a folded convolution in torchvision's state dict."""
    if spec.name == STEM.name:
        return "conv1.weight", "bn1"
    block, conv = spec.name.rsplit(".", 1)
    if conv == "downsample":
        return f"{block}.downsample.0.weight", f"{block}.downsample.1"
    return f"{spec.name}.weight", f"{block}.{conv.replace('conv', 'bn')}"


class _Graph:
    """The ONNX graph's values, producers and consumers, with Identity nodes looked through."""

    def __init__(self, model, path):
        from onnx import numpy_helper
        self.path = path
        graph = model.graph
        self.values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.alias = {}
        self.nodes = []
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                self.fail(node, f"operator {node.domain}::{node.op_type} is not part of ResNet-18")
            if node.op_type == "Constant":
                attr = {a.name: a for a in node.attribute}
                if "value" not in attr:
                    self.fail(node, "Constant without a tensor value")
                self.values[node.output[0]] = numpy_helper.to_array(attr["value"].t)
            elif node.op_type == "Identity":
                self.alias[node.output[0]] = node.input[0]
            elif node.op_type not in GRAPH_OPS:
                self.fail(node, f"unexpected operator {node.op_type}: a ResNet-18 has only "
                                f"{', '.join(GRAPH_OPS)}")
            else:
                self.nodes.append(node)
        self.consumers: dict[str, list] = {}
        for node in self.nodes:
            for name in node.input:
                if name:
                    self.consumers.setdefault(self.resolve(name), []).append(node)
        self.inputs = [i for i in graph.input if i.name not in self.values]
        self.outputs = [self.resolve(o.name) for o in graph.output]
        self.visited: set[int] = set()

    def resolve(self, name: str) -> str:
        while name in self.alias:
            name = self.alias[name]
        return name

    def fail(self, node, message: str):
        where = f"node {node.name or '(unnamed)'} ({node.op_type})" if node is not None else "graph"
        raise OnnxImportError(f"{self.path}: {where}: {message}")

    def visit(self, node):
        self.visited.add(id(node))
        return node

    def next_node(self, value: str, op: str, after: str):
        """The one node that consumes `value`, which must be an `op`."""
        found = self.consumers.get(self.resolve(value), [])
        if len(found) != 1 or found[0].op_type != op:
            seen = ", ".join(f"{n.op_type} {n.name}" for n in found) or "nothing"
            raise OnnxImportError(f"{self.path}: after {after} expected one {op}, found {seen}")
        return self.visit(found[0])

    def initializer(self, node, index: int, what: str, shape: tuple | None = None) -> np.ndarray:
        if index >= len(node.input) or not node.input[index]:
            self.fail(node, f"missing input {index} ({what})")
        name = self.resolve(node.input[index])
        if name not in self.values:
            self.fail(node, f"{what} {name!r} is not an initialiser (missing initialiser)")
        value = self.values[name]
        if shape is not None and tuple(value.shape) != tuple(shape):
            self.fail(node, f"{what} {name!r} has shape {tuple(value.shape)}, expected {tuple(shape)}")
        return value

    @staticmethod
    def attributes(node) -> dict:
        from onnx import helper
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def expect_attributes(self, node, expected: dict, defaults: dict):
        attrs = self.attributes(node)
        for key, want in expected.items():
            got = attrs.get(key, defaults.get(key))
            got = list(got) if isinstance(got, (list, tuple)) else got
            if got != want:
                self.fail(node, f"attribute {key} is {got}, expected {want}")
        if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            self.fail(node, f"auto_pad {attrs['auto_pad']!r} is not supported, expected explicit pads")


def _tensor(array) -> torch.Tensor:
    return torch.from_numpy(np.array(array, dtype=np.float32))  # a writable copy


def _conv(graph: _Graph, node, spec: ConvSpec, template: dict, state: dict) -> str:
    """Read one convolution and its BatchNorm (or the folded bias) into `state`; returns its output value."""
    weight_key, bn = state_dict_keys(spec)
    k = spec.kernel
    graph.expect_attributes(node, {"strides": [spec.stride] * 2, "pads": [spec.padding] * 4,
                                   "dilations": [1, 1], "group": 1, "kernel_shape": [k, k]},
                            {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1,
                             "kernel_shape": [k, k]})
    state[weight_key] = _tensor(graph.initializer(node, 1, f"{spec.name} weight", template[weight_key].shape))
    channels = (spec.out_channels,)
    conv_bias = (graph.initializer(node, 2, f"{spec.name} bias", channels).astype(np.float64)
                 if len(node.input) > 2 and node.input[2] else np.zeros(channels))
    out = node.output[0]
    followers = graph.consumers.get(graph.resolve(out), [])
    if len(followers) == 1 and followers[0].op_type == "BatchNormalization":
        bn_node = graph.visit(followers[0])
        gamma, beta, mean, var = (graph.initializer(bn_node, i, f"{bn} {what}", channels).astype(np.float64)
                                  for i, what in enumerate(("scale", "bias", "mean", "var"), start=1))
        eps = float(graph.attributes(bn_node).get("epsilon", 1e-5))
        if graph.attributes(bn_node).get("training_mode", 0):
            graph.fail(bn_node, "BatchNormalization in training mode; export the model in eval mode")
        mean = mean - conv_bias
        var = var + eps - BATCHNORM_EPS
        out = bn_node.output[0]
    else:
        gamma, beta = np.ones(channels), conv_bias
        mean, var = np.zeros(channels), np.full(channels, 1.0 - BATCHNORM_EPS)
    for name, value in (("weight", gamma), ("bias", beta), ("running_mean", mean), ("running_var", var)):
        state[f"{bn}.{name}"] = _tensor(value)
    state[f"{bn}.num_batches_tracked"] = torch.tensor(0, dtype=torch.long)
    return out


def _conv_relu(graph: _Graph, value: str, spec: ConvSpec, template: dict, state: dict, node=None) -> str:
    node = node or graph.next_node(value, "Conv", f"{value!r}")
    out = _conv(graph, node, spec, template, state)
    return graph.next_node(out, "Relu", spec.name).output[0]


def _global_average_pool(graph: _Graph, x: str) -> str:
    """GlobalAveragePool (TorchScript exporter), or ReduceMean over H and W (dynamo exporter); its output."""
    found = graph.consumers.get(graph.resolve(x), [])
    if len(found) == 1 and found[0].op_type == "ReduceMean":
        node = graph.visit(found[0])
        attrs = graph.attributes(node)
        axes = attrs.get("axes") if "axes" in attrs else (
            graph.initializer(node, 1, "axes").tolist() if len(node.input) > 1 and node.input[1] else None)
        if axes is None or sorted(a % 4 for a in axes) != [2, 3]:
            graph.fail(node, f"ReduceMean over axes {axes}, expected the spatial axes [2, 3]")
        return node.output[0]
    return graph.next_node(x, "GlobalAveragePool", "layer4").output[0]


def _flatten(graph: _Graph, pooled: str) -> str:
    """Flatten(axis 1) or Reshape to [N, 512] after the pool, if any (a ReduceMean without keepdims needs none)."""
    found = graph.consumers.get(graph.resolve(pooled), [])
    if len(found) != 1 or found[0].op_type not in ("Flatten", "Reshape"):
        return pooled
    node = graph.visit(found[0])
    if node.op_type == "Flatten":
        graph.expect_attributes(node, {"axis": 1}, {"axis": 1})
    else:
        shape = graph.initializer(node, 1, "shape").tolist()
        if len(shape) != 2 or shape[1] != STAGE_CHANNELS[-1]:   # any batch: a static export says [1, 512]
            graph.fail(node, f"Reshape to {shape}, expected [N, {STAGE_CHANNELS[-1]}]")
    return node.output[0]


def _walk(graph: _Graph, template: dict) -> dict:
    state: dict[str, torch.Tensor] = {}
    if len(graph.inputs) != 1:
        raise OnnxImportError(f"{graph.path}: expected one image input, found "
                              f"{[i.name for i in graph.inputs]}")
    image = graph.inputs[0]
    dims = image.type.tensor_type.shape.dim
    if len(dims) != 4 or (dims[1].HasField("dim_value") and dims[1].dim_value != 3):
        shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
        raise OnnxImportError(f"{graph.path}: input {image.name!r} has shape {shape}, expected [N, 3, H, W]")
    x = _conv_relu(graph, image.name, STEM, template, state)
    pool = graph.next_node(x, "MaxPool", "the stem")
    graph.expect_attributes(pool, {"kernel_shape": [MAXPOOL_KERNEL] * 2, "strides": [MAXPOOL_STRIDE] * 2,
                                   "pads": [MAXPOOL_PADDING] * 4, "ceil_mode": 0, "dilations": [1, 1]},
                            {"strides": [1, 1], "pads": [0, 0, 0, 0], "ceil_mode": 0, "dilations": [1, 1]})
    x = pool.output[0]
    for block in resnet18_blocks():
        where = block.conv1.name.rsplit(".", 1)[0]
        consumers = graph.consumers.get(graph.resolve(x), [])
        convs = {int(graph.initializer(n, 1, "weight").shape[-1]): n for n in consumers if n.op_type == "Conv"}
        expected = {3: "Conv (conv1)", 1: "Conv (downsample)"} if block.downsample else {3: "Conv (conv1)"}
        others = [n for n in consumers if n.op_type != "Conv"]
        if set(convs) != set(expected) or len(convs) + len(others) != len(consumers) \
                or len(others) != (0 if block.downsample else 1) or (others and others[0].op_type != "Add"):
            seen = ", ".join(f"{n.op_type} {n.name}" for n in consumers) or "nothing"
            raise OnnxImportError(f"{graph.path}: {where} input is used by {seen}; expected "
                                  f"{', '.join(expected.values())}{'' if block.downsample else ' and the Add'}")
        identity = x
        if block.downsample is not None:
            identity = _conv(graph, graph.visit(convs[1]), block.downsample, template, state)
        t = _conv_relu(graph, x, block.conv1, template, state, graph.visit(convs[3]))
        conv2 = graph.next_node(t, "Conv", block.conv1.name)
        out = _conv(graph, conv2, block.conv2, template, state)
        add = graph.next_node(out, "Add", block.conv2.name)
        if {graph.resolve(i) for i in add.input} != {graph.resolve(out), graph.resolve(identity)}:
            graph.fail(add, f"{where}: expected the sum of conv2 and the shortcut")
        x = graph.next_node(add.output[0], "Relu", f"{where} Add").output[0]
    pooled = _global_average_pool(graph, x)
    gemm = graph.next_node(_flatten(graph, pooled), "Gemm", "the average pool")
    attrs = graph.attributes(gemm)
    if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
        graph.fail(gemm, "expected Gemm with transA 0, alpha 1, beta 1")
    fc_shape = tuple(template["fc.weight"].shape)
    weight = graph.initializer(gemm, 1, "fc weight", fc_shape if attrs.get("transB", 0) else fc_shape[::-1])
    state["fc.weight"] = _tensor(weight if attrs.get("transB", 0) else weight.T)
    state["fc.bias"] = _tensor(graph.initializer(gemm, 2, "fc bias", template["fc.bias"].shape))
    if graph.outputs != [graph.resolve(gemm.output[0])]:
        raise OnnxImportError(f"{graph.path}: expected the Gemm's logits as the only output, found "
                              f"{graph.outputs}")
    extra = [n for n in graph.nodes if id(n) not in graph.visited]
    if extra:
        graph.fail(extra[0], f"is not part of ResNet-18 ({len(extra)} node(s) off the network's path)")
    return state


def state_dict_from_onnx(path) -> dict[str, torch.Tensor]:
    """torchvision ResNet-18 state dict (float32) from an ONNX file; OnnxImportError if it is not one."""
    try:
        import onnx
    except ImportError as error:
        raise ImportError("reading ONNX weights needs the onnx package (pip install onnx)") from error
    path = Path(path)
    if not path.is_file():
        raise OnnxImportError(f"{path}: no such file")
    try:
        model = onnx.load(str(path))
    except Exception as error:   # onnx raises DecodeError, ValueError, ... for files that are not ONNX
        raise OnnxImportError(f"{path}: not a readable ONNX model ({error})") from error
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    if opsets.get("ai.onnx", 0) < MIN_OPSET:
        raise OnnxImportError(f"{path}: opset {opsets.get('ai.onnx')}; supported: {MIN_OPSET} and later")
    template = ResNet18().state_dict()
    state = _walk(_Graph(model, path), template)
    missing = sorted(set(template) - set(state))
    if missing:   # cannot happen if the walk is right; a guard against a wrong key mapping
        raise OnnxImportError(f"{path}: no value for {missing[:5]}")
    return state

