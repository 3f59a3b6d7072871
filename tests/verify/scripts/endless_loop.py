"""A training loop that never ends on its own, and starts a helper process (as a data loader's worker would):
the script ``ampkit compare`` must stop, with everything it started, when ampkit is stopped.

python endless_loop.py PIDFILE   (the helper's pid is written to PIDFILE)
"""

import subprocess
import sys
import time

import torch
from torch import nn

helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(sys.argv[1], "w") as f:
    f.write(str(helper.pid))
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
while True:
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    time.sleep(0.01)
