#!/usr/bin/python3
"""PyTorch trains the seeds' ResNet-18 recipe end to end: the peer's own draw of
the figure `anvil-train --model resnet18 --recipe seed` is measured against.

    /usr/bin/python3 scripts/torch_seed_recipe.py [--seed S] [--epochs 10]
                                                  [--bn-recalibrate 20] [--out FILE.jsonl]

What seed 002/004 run (d2l "multiple-gpus-concise", one device):
  - d2l.load_data_fashion_mnist(256): pixels / 255 (ToTensor), no resize, no
    normalisation, no augmentation; the training set reshuffled every epoch,
    the last batch of 96 images kept (drop_last=False);
  - the d2l ResNet-18 (tests/golden/seed_models.py), conv and linear weights
    redrawn from N(0, 0.01), every other parameter PyTorch's default;
  - plain SGD (no momentum, no weight decay) at the seed recipe's lr 0.1 for
    resnet18 (apps/recipes.json, read here), cross-entropy, 10 epochs;
  - after each epoch, accuracy on the 10,000 test images in eval mode
    (d2l.evaluate_accuracy_gpu), i.e. with BatchNorm's running statistics.
The seeds print the last epoch's figure of one run. This script prints one JSON
line per epoch (train loss and accuracy, test loss and accuracy, seconds,
images/s) and, with --bn-recalibrate N, after the last epoch also the test
figures with BatchNorm's statistics re-estimated over N training batches
(scripts/torch_eval.py's recalibrate_batch_norm), as anvil-train
--bn-recalibrate reports them. Only --seed changes between draws: it seeds
torch (the init, the shuffles). --init-from and --no-shuffle take the init and
the order out of the draw, to compare anvil's and PyTorch's runs step for step.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "golden"))
sys.path.insert(0, HERE)
from seed_models import resnet18  # noqa: E402
from torch_eval import evaluate, read_anvil_model, read_idx, recalibrate_batch_norm  # noqa: E402
from anvil_recipes import recipe  # noqa: E402

SEED_RECIPE = recipe("seed", "resnet18")


def read_split(data_dir, images_name, labels_name):
    """Images as float pixels / 255 in [N, 1, 28, 28], labels as int64."""
    for name in (images_name, labels_name):
        if not os.path.exists(os.path.join(data_dir, name)):
            sys.exit(f"{os.path.join(data_dir, name)}: no such file "
                     "(apt-get install dataset-fashion-mnist, or --data-dir)")
    images = read_idx(data_dir, images_name, 16).reshape(-1, 1, 28, 28)
    labels = read_idx(data_dir, labels_name, 8)
    if len(images) != len(labels):
        sys.exit(f"{data_dir}: {len(images)} images but {len(labels)} labels")
    return (torch.from_numpy(images.astype(np.float32) / 255.0),
            torch.from_numpy(labels.astype(np.int64)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="torch.manual_seed (init and shuffles)")
    ap.add_argument("--epochs", type=int, default=SEED_RECIPE["epochs"])
    ap.add_argument("--bn-recalibrate", type=int, default=0, metavar="N",
                    help="after the last epoch, also evaluate with BatchNorm statistics "
                         "re-estimated over N training batches")
    ap.add_argument("--out", help="also append each JSON line to this file")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch.set_num_threads (default: every core)")
    ap.add_argument("--init-from", metavar="FILE",
                    help="start from these weights (an anvil-train --save file) instead of "
                         "the seeds' init: with --no-shuffle, the same run as anvil-train "
                         "--init-from FILE --no-shuffle, step for step")
    ap.add_argument("--no-shuffle", action="store_true", help="keep the training set in file order")
    ap.add_argument("--limit", type=int, default=0, metavar="N",
                    help="train on the first N training images only (a quick smoke run)")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    if args.epochs < 1:
        sys.exit(f"--epochs: {args.epochs}: must be >= 1")
    if args.threads < 1:
        sys.exit(f"--threads: {args.threads}: must be >= 1")
    if args.limit < 0:
        sys.exit(f"--limit: {args.limit}: must be >= 0")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_x, train_y = read_split(args.data_dir, "train-images-idx3-ubyte.gz",
                                  "train-labels-idx1-ubyte.gz")
    test_x, test_y = read_split(args.data_dir, "t10k-images-idx3-ubyte.gz",
                                "t10k-labels-idx1-ubyte.gz")
    if args.limit:
        train_x, train_y = train_x[:args.limit], train_y[:args.limit]

    net = resnet18(10)

    def init_weights(m):  # the seeds' init_weights
        if type(m) in [nn.Linear, nn.Conv2d]:
            nn.init.normal_(m.weight, std=0.01)
    net.apply(init_weights)
    if args.init_from:
        net.load_state_dict(read_anvil_model(args.init_from)[0], strict=True)
    trainer = torch.optim.SGD(net.parameters(), lr=SEED_RECIPE["lr"])
    loss_fn = nn.CrossEntropyLoss()
    batch_size = SEED_RECIPE["batch-size"]

    def emit(record):
        line = json.dumps(record)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")

    for epoch in range(1, args.epochs + 1):
        net.train()
        order = (torch.arange(len(train_x)) if args.no_shuffle
                 else torch.randperm(len(train_x)))  # DataLoader(shuffle=True)
        loss_sum, correct = 0.0, 0
        start_time = time.perf_counter()
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            x, y = train_x[idx], train_y[idx]
            trainer.zero_grad()
            logits = net(x)
            loss = loss_fn(logits, y)
            loss.backward()
            trainer.step()
            loss_sum += loss.item() * len(idx)
            correct += (logits.argmax(1) == y).sum().item()
        seconds = time.perf_counter() - start_time
        test_loss, test_acc = evaluate(net, test_x, test_y)
        emit({"framework": "pytorch", "torch": torch.__version__, "seed": args.seed,
              "threads": torch.get_num_threads(), "epoch": epoch,
              "train_loss": round(loss_sum / len(train_x), 4),
              "train_acc": round(correct / len(train_x), 4),
              "test_loss": round(test_loss, 4), "test_acc": test_acc,
              "seconds": round(seconds, 1), "images_per_second": round(len(train_x) / seconds, 1)})

    if args.bn_recalibrate:
        recalibrate_batch_norm(net, train_x, lambda images: images, args.bn_recalibrate)
        test_loss, test_acc = evaluate(net, test_x, test_y)
        emit({"framework": "pytorch", "seed": args.seed, "epoch": args.epochs,
              "bn_recalibrate": args.bn_recalibrate,
              "test_loss_recalibrated": round(test_loss, 4), "test_acc_recalibrated": test_acc})


if __name__ == "__main__":
    main()
