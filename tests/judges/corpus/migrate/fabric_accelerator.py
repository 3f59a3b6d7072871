# Modelled on Lightning-AI/pytorch-lightning examples/fabric/image_classifier/train_fabric.py and its
# Trainer examples (Apache-2.0): Lightning's accelerator names reach Fabric and Trainer through variables
# and keywords; tensors made outside Lightning use a torch device. Written for ampkit's judge corpus.
import argparse

import lightning as L
import torch

parser = argparse.ArgumentParser(description="Fabric MNIST Example")
parser.add_argument("--accelerator", default="cuda", help="Lightning accelerator: cpu, cuda, gpu, auto")
parser.add_argument("--precision", default="16-mixed")


def run(hparams, model, train_loader):
    accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    fabric = L.Fabric(accelerator=accelerator, devices=1, precision=hparams.precision)
    fabric.seed_everything(hparams.seed)
    model, optimizer = fabric.setup(model, torch.optim.Adadelta(model.parameters(), lr=1.0))
    train_loader = fabric.setup_dataloaders(train_loader)
    for data, target in train_loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.nll_loss(model(data), target)
        fabric.backward(loss)
        optimizer.step()


def trainer(model, datamodule, hparams):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    example = torch.zeros(1, 1, 28, 28, device=device)
    trainer = L.Trainer(accelerator=hparams.accelerator, devices=1, precision="16-mixed", max_epochs=1)
    trainer.fit(model, datamodule=datamodule)
    gpu_trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed")
    return gpu_trainer, example
