"""Write train.jsonl (400 rows) and validation.jsonl (100 rows): two-digit additions like
{"prompt": "37+45=", "answer": "82"}, all prompts distinct. Run once: python make_data.py"""

import json
import random

rng = random.Random(2026)
pairs = rng.sample([(a, b) for a in range(100) for b in range(100)], 500)
rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs]
for name, part in (("train.jsonl", rows[:400]), ("validation.jsonl", rows[400:])):
    with open(name, "w") as file:
        file.writelines(json.dumps(row) + "\n" for row in part)
