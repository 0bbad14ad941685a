"""The seeds' PyTorch models, re-typed (shared/seeds): LeNet as anvil trains it,
and d2l's ResNet-18 in both forms. Used by make_resnet_golden.py (golden values)
and scripts/torch_eval.py (PyTorch evaluating an anvil checkpoint).

d2l's Residual (conv1, conv2, optional conv3, bn1, bn2;
y = relu(bn2(conv2(relu(bn1(conv1(x)))))) + shortcut) comes in two forms: the
explicit-channel one of d2l 0.17 that seeds 002/004 use and the Lazy one of
d2l 1.0 that seed 000's 96x96 variant uses. Both give the same state-dict names.
"""
from torch import nn
from torch.nn import functional as F


def lenet(num_classes=10):
    """anvil's models::lenet: the seeds' LeNet variant (3x3 first conv, average pooling)."""
    return nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2, 2), nn.Conv2d(20, 50, 5),
                         nn.ReLU(), nn.AvgPool2d(2, 2), nn.Flatten(), nn.Linear(800, 128), nn.ReLU(),
                         nn.Linear(128, num_classes))


class d2l_v0:  # noqa: N801  a namespace, so that print(model) says "Residual"
    class Residual(nn.Module):
        """d2l 0.17's Residual, as seeds 002 and 004 call it."""

        def __init__(self, input_channels, num_channels, use_1x1conv=False, strides=1):
            super().__init__()
            self.conv1 = nn.Conv2d(input_channels, num_channels, kernel_size=3, padding=1,
                                   stride=strides)
            self.conv2 = nn.Conv2d(num_channels, num_channels, kernel_size=3, padding=1)
            self.conv3 = (nn.Conv2d(input_channels, num_channels, kernel_size=1,
                                    stride=strides) if use_1x1conv else None)
            self.bn1 = nn.BatchNorm2d(num_channels)
            self.bn2 = nn.BatchNorm2d(num_channels)

        def forward(self, X):
            Y = F.relu(self.bn1(self.conv1(X)))
            Y = self.bn2(self.conv2(Y))
            if self.conv3:
                X = self.conv3(X)
            Y += X
            return F.relu(Y)


class d2l_v1:  # noqa: N801
    class Residual(nn.Module):
        """d2l 1.0's Residual (input channels inferred), as seed 000 calls it."""

        def __init__(self, num_channels, use_1x1conv=False, strides=1):
            super().__init__()
            self.conv1 = nn.LazyConv2d(num_channels, kernel_size=3, padding=1, stride=strides)
            self.conv2 = nn.LazyConv2d(num_channels, kernel_size=3, padding=1)
            self.conv3 = (nn.LazyConv2d(num_channels, kernel_size=1, stride=strides)
                          if use_1x1conv else None)
            self.bn1 = nn.LazyBatchNorm2d()
            self.bn2 = nn.LazyBatchNorm2d()

        forward = d2l_v0.Residual.forward


def resnet18(num_classes, in_channels=1, widths=(64, 128, 256, 512)):
    """Seeds 002/004 (d2l's 'slightly modified ResNet-18'); widths added for tests."""
    def resnet_block(in_channels, out_channels, num_residuals, first_block=False):
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(d2l_v0.Residual(in_channels, out_channels, use_1x1conv=True,
                                          strides=2))
            else:
                blk.append(d2l_v0.Residual(out_channels, out_channels))
        return nn.Sequential(*blk)

    w1, w2, w3, w4 = widths
    net = nn.Sequential(
        nn.Conv2d(in_channels, w1, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(w1),
        nn.ReLU())
    net.add_module("resnet_block1", resnet_block(w1, w1, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(w1, w2, 2))
    net.add_module("resnet_block3", resnet_block(w2, w3, 2))
    net.add_module("resnet_block4", resnet_block(w3, w4, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(w4, num_classes)))
    return net


def resnet18_96(num_classes, in_channels=1):
    """Seed 000's ResNet-18 for Fashion-MNIST resized to 96x96 (7x7 stem, max pool)."""
    def resnet_block(in_channels, out_channels, num_residuals, first_block=False):
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(d2l_v1.Residual(out_channels, use_1x1conv=True, strides=2))
            else:
                blk.append(d2l_v1.Residual(out_channels))
        return blk

    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3),
        nn.BatchNorm2d(64), nn.ReLU(),
        nn.MaxPool2d(kernel_size=3, stride=2, padding=1))
    net.add_module("resnet_block1", nn.Sequential(*resnet_block(64, 64, 2, first_block=True)))
    net.add_module("resnet_block2", nn.Sequential(*resnet_block(64, 128, 2)))
    net.add_module("resnet_block3", nn.Sequential(*resnet_block(128, 256, 2)))
    net.add_module("resnet_block4", nn.Sequential(*resnet_block(256, 512, 2)))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net
