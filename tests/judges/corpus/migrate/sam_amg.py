# Modelled on facebookresearch/segment-anything scripts/amg.py (Apache-2.0): the device is a command-line
# default, moved into the model and reported in the log. Written for ampkit's judge corpus.
import argparse

import torch

parser = argparse.ArgumentParser(description="Runs automatic mask generation on an input image or directory of images.")
parser.add_argument("--checkpoint", type=str, required=True, help="The path to the SAM checkpoint to use.")
parser.add_argument("--device", type=str, default="cuda", help="The device to run generation on.")
parser.add_argument("--fp16", action="store_true", help="Run the image encoder under FP16 autocast.")


def main(args, build_sam):
    print("Loading model...")
    sam = build_sam(checkpoint=args.checkpoint)
    _ = sam.to(device=args.device)
    print(f"Running on {args.device}; CUDA available: {torch.cuda.is_available()}")
    with torch.autocast(device_type=args.device.split(":")[0], dtype=torch.float16, enabled=args.fp16):
        masks = sam(torch.zeros(1, 3, 64, 64, device=args.device))
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return masks
