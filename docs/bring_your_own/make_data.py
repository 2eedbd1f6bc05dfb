"""Write the example's rows, all prompts of a task distinct. Run once: python make_data.py

- train.jsonl (400 rows) and validation.jsonl (100 rows): two-digit additions like
  {"prompt": "37+45=", "answer": "82"}.
- larger/train.jsonl (400) and larger/validation.jsonl (100): a question in words, like
  {"prompt": "Which is larger, 27 or 82?", "answer": "82"}.
"""

import json
import random
from pathlib import Path


def write(folder, rows, num_train=400):
    folder = Path(folder)
    folder.mkdir(exist_ok=True)
    for name, part in (("train.jsonl", rows[:num_train]), ("validation.jsonl", rows[num_train:])):
        with open(folder / name, "w") as file:
            file.writelines(json.dumps(row) + "\n" for row in part)


rng = random.Random(2026)
pairs = rng.sample([(a, b) for a in range(100) for b in range(100)], 500)
write(".", [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs])

rng = random.Random(2027)
pairs = rng.sample([(a, b) for a in range(10, 100) for b in range(10, 100) if a != b], 500)
write("larger", [{"prompt": f"Which is larger, {a} or {b}?", "answer": str(max(a, b))} for a, b in pairs])
