"""A language model trained as pytorch/examples' word_language_model trains it: no optimizer, the
parameters updated by hand after clipping their gradients. `python hand_updated.py STEPS` (default 60)."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
vocabulary, width, length, batch = 200, 64, 20, 16
data = torch.randint(0, vocabulary, (4000,))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.rnn = nn.LSTM(width, width, batch_first=True)
        self.out = nn.Linear(width, vocabulary)

    def forward(self, x):
        return self.out(self.rnn(self.embed(x))[0])


model = Model()
lr = 20.0
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 60):
    starts = torch.randint(0, len(data) - length - 1, (batch,))
    x = torch.stack([data[s:s + length] for s in starts])
    y = torch.stack([data[s + 1:s + length + 1] for s in starts])
    model.zero_grad()
    loss = nn.functional.cross_entropy(model(x).reshape(-1, vocabulary), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
print(f"trained: loss {loss.item():.3f}")
