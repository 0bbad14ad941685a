# Loads an anvil LeNet checkpoint into PyTorch (strict=True) and evaluates it on the
# Fashion-MNIST test set: /usr/bin/python3 scripts/torch_eval_lenet.py lenet.safetensors
import gzip, json, struct, sys
import numpy as np, torch
from torch import nn
path = sys.argv[1]
raw = open(path, 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
hdr = json.loads(raw[8:8+n]); data = raw[8+n:]
sd = {}
for k, v in hdr.items():
    if k == '__metadata__': continue
    b, e = v['data_offsets']
    sd[k] = torch.frombuffer(bytearray(data[b:e]), dtype={'F32': torch.float32, 'I64': torch.int64}[v['dtype']]).reshape(v['shape'])
net = nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2, 2), nn.Conv2d(20, 50, 5), nn.ReLU(),
                    nn.AvgPool2d(2, 2), nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))
net.load_state_dict(sd, strict=True)
d = '/usr/share/datasets/fashion-mnist/'
x = np.frombuffer(gzip.open(d + 't10k-images-idx3-ubyte.gz').read()[16:], np.uint8).reshape(-1, 1, 28, 28)
y = np.frombuffer(gzip.open(d + 't10k-labels-idx1-ubyte.gz').read()[8:], np.uint8)
with torch.no_grad():
    out = net(torch.tensor(x, dtype=torch.float32) / 255)
print('pytorch test acc of the anvil checkpoint:', (out.argmax(1).numpy() == y).mean())
