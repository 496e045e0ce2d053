"""Built-in models, written here because torchvision does not import beside our torch.

Standard architectures and input shapes (batch 1, 224x224 ImageNet; the demo CNN takes 32x32;
BERT-base takes 128 token ids and their attention mask; no ``transformers`` needed at run time),
random weights under a fixed seed: tuning and timing do not depend on the weight values, and
numerical checks compare against the same weights in PyTorch.
"""
from __future__ import annotations

import torch
from torch import nn


def _conv_bn(cin, cout, k=3, stride=1, groups=1, act=nn.ReLU):
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act(inplace=True)) if act else nn.Sequential(*layers)


class DemoCNN(nn.Module):
    """A small CIFAR-sized CNN: three conv blocks and a classifier (tunes in minutes)."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn(3, 32), nn.MaxPool2d(2),
            _conv_bn(32, 64), nn.MaxPool2d(2),
            _conv_bn(64, 128), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(128, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


class _PooledClassifier(nn.Module):
    """``features``, then AlexNet's and VGG's head: adaptive average pool to ``pool``x``pool`` and
    three fully connected layers."""

    def __init__(self, features, channels: int, pool: int, num_classes: int):
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((pool, pool))
        self.classifier = nn.Sequential(
            nn.Linear(channels * pool * pool, 4096), nn.ReLU(inplace=True),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Linear(4096, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class AlexNet(_PooledClassifier):
    def __init__(self, num_classes=1000):
        super().__init__(nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2)), 256, 6, num_classes)


class VGG16(_PooledClassifier):
    CFG = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]

    def __init__(self, num_classes=1000):
        layers, cin = [], 3
        for v in self.CFG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=True)]
                cin = v
        super().__init__(nn.Sequential(*layers), 512, 7, num_classes)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(_conv_bn(cin, cout, 3, stride), _conv_bn(cout, cout, 3, act=None))
        self.down = _conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.down(x))


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 reduce, 3x3 (stride here, as torchvision's v1.5), 1x1 expand by 4."""

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(_conv_bn(cin, width, 1), _conv_bn(width, width, 3, stride),
                                  _conv_bn(width, cout, 1, act=None))
        self.down = _conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.down(x))


class ResNet18(nn.Module):
    BLOCK, DEPTHS, EXPANSION = BasicBlock, (2, 2, 2, 2), 1

    def __init__(self, num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for (width, stride), depth in zip([(64, 1), (128, 2), (256, 2), (512, 2)], self.DEPTHS):
            for i in range(depth):
                blocks.append(self.BLOCK(cin, width, stride if i == 0 else 1))
                cin = width * self.EXPANSION
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class ResNet50(ResNet18):
    """ResNet-50 (He et al. 2016, torchvision's layout): bottleneck blocks, depths 3-4-6-3."""
    BLOCK, DEPTHS, EXPANSION = Bottleneck, (3, 4, 6, 3), 4


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        layers = [_conv_bn(cin, hidden, 1, act=nn.ReLU6)] if expand != 1 else []
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
                   _conv_bn(hidden, cout, 1, act=None)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    # (expansion t, channels c, repeats n, first stride s), as in Sandler et al. 2018, Table 2
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]

    def __init__(self, num_classes=1000):
        super().__init__()
        layers, cin = [_conv_bn(3, 32, 3, 2, act=nn.ReLU6)], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class _Attention(nn.Module):
    """Multi-head self-attention written out (matmul, scale, mask, softmax, matmul), as BERT's and
    ViT's eager implementations compute it."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.ModuleList(nn.Linear(dim, dim) for _ in range(3))
        self.out = nn.Linear(dim, dim)

    def forward(self, x, mask_bias=None):
        b, n, d = x.shape
        q, k, v = (lin(x).view(b, n, self.heads, d // self.heads).transpose(1, 2) for lin in self.qkv)
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
        if mask_bias is not None:
            scores = scores + mask_bias
        y = torch.softmax(scores, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, n, d))


class _EncoderLayer(nn.Module):
    """A transformer encoder layer: post-norm (BERT) or pre-norm (ViT), GELU MLP."""

    def __init__(self, dim, heads, hidden, pre_norm, eps):
        super().__init__()
        self.pre_norm = pre_norm
        self.attn, self.norm1, self.norm2 = _Attention(dim, heads), nn.LayerNorm(dim, eps=eps), nn.LayerNorm(dim, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x, mask_bias=None):
        if self.pre_norm:
            x = x + self.attn(self.norm1(x), mask_bias)
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn(x, mask_bias))
        return self.norm2(x + self.mlp(x))


class Bert(nn.Module):
    """BERT-base (Devlin et al.), computed as Hugging Face's ``BertModel`` computes it.

    Takes token ids and an attention mask, returns the last hidden state and the pooled output."""

    def __init__(self, vocab=30522, dim=768, layers=12, heads=12, hidden=3072, max_len=512):
        super().__init__()
        self.words, self.positions, self.types = nn.Embedding(vocab, dim), nn.Embedding(max_len, dim), nn.Embedding(2, dim)
        self.norm = nn.LayerNorm(dim, eps=1e-12)
        self.layers = nn.ModuleList(_EncoderLayer(dim, heads, hidden, False, 1e-12) for _ in range(layers))
        self.pooler = nn.Linear(dim, dim)

    def forward(self, input_ids, attention_mask):
        n = input_ids.shape[1]
        x = self.words(input_ids) + self.positions.weight[:n] + self.types.weight[0]
        x = self.norm(x)
        mask_bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask_bias)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pooler(x[:, 0]))}


class ViT(nn.Module):
    """Vision Transformer ViT-B/16 (Dosovitskiy et al.): 16x16 patches and a class token.

    Pre-norm encoder layers; the class token's final state is classified."""

    def __init__(self, image=224, patch=16, dim=768, layers=12, heads=12, hidden=3072, num_classes=1000):
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.positions = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.layers = nn.ModuleList(_EncoderLayer(dim, heads, hidden, True, 1e-6) for _ in range(layers))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)[:, 0])


#: name -> (constructor, input shape | {input name: (shape, dtype)})
MODELS = {
    "demo-cnn": (DemoCNN, (1, 3, 32, 32)),
    "alexnet": (AlexNet, (1, 3, 224, 224)),
    "vgg16": (VGG16, (1, 3, 224, 224)),
    "resnet18": (ResNet18, (1, 3, 224, 224)),
    "resnet50": (ResNet50, (1, 3, 224, 224)),
    "mobilenetv2": (MobileNetV2, (1, 3, 224, 224)),
    "bert-base": (Bert, {"input_ids": ((1, 128), "int64"), "attention_mask": ((1, 128), "int64")}),
    "vit-base": (ViT, (1, 3, 224, 224)),
}
DEFAULT_MODEL = "demo-cnn"


def build(name: str, seed: int = 0) -> tuple[nn.Module, "tuple[int, ...] | dict"]:
    """The zoo model ``name`` in eval mode with seeded random weights, and its input shape (or its
    named inputs' shapes and dtypes)."""
    ctor, shape = MODELS[name]
    torch.manual_seed(seed)
    model = ctor().eval()
    with torch.no_grad():       # non-trivial BatchNorm statistics, so folding them is really checked
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model, shape
