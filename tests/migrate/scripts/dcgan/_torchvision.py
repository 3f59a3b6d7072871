"""Stand-in for the parts of torchvision that dcgan/main.py uses (torchvision is not installed here)."""
import types

import torch


class FakeData(torch.utils.data.Dataset):
    """torchvision.datasets.FakeData: random images and labels, 8 of them (torchvision's default is 1000)."""

    def __init__(self, size=8, image_size=(3, 224, 224), num_classes=10, transform=None):
        gen = torch.Generator().manual_seed(0)
        self.images = torch.rand(size, *image_size, generator=gen)
        self.labels = torch.randint(0, num_classes, (size,), generator=gen)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def save_image(tensor, path, normalize=False):
    """torchvision.utils.save_image: here the tensor itself is saved (no image library needed)."""
    torch.save(tensor.detach().cpu(), path)


dset = types.SimpleNamespace(FakeData=FakeData)
transforms = types.SimpleNamespace(ToTensor=lambda: None)
vutils = types.SimpleNamespace(save_image=save_image)
