"""Ask the code interpreter for a plot of a CSV and save the PNG it made, with the SDK.

scripts/sandbox-packages DIR                 # numpy, pandas, matplotlib for user code
trio-responses serve --code-interpreter --python-packages DIR &
python examples/plot_with_code_interpreter.py [BASE_URL] [OUT.png]

The CSV goes up with ``client.files.create``; the response's container gets it
(``file_ids``) at ``/mnt/data/sales.csv``; the code saves ``/mnt/data/plot.png``,
which the answer cites (``container_file_citation``) and this script downloads
(``client.containers.files.content.retrieve``).
"""

from __future__ import annotations

import sys

from openai import OpenAI

SALES = b"month,sales\nJan,120\nFeb,135\nMar,160\nApr,150\n"

ASK = """\
Plot the monthly sales in /mnt/data/sales.csv as a bar chart, save it as
/mnt/data/plot.png and tell me where it is.
```python
import matplotlib.pyplot as plt
import pandas as pd

sales = pd.read_csv("/mnt/data/sales.csv")
sales.plot.bar(x="month", y="sales", legend=False)
plt.savefig("/mnt/data/plot.png")
print("saved /mnt/data/plot.png")
```"""


def main(base_url: str, out: str) -> None:
    client = OpenAI(base_url=base_url, api_key="unused")
    model = client.models.list().data[0].id
    csv = client.files.create(file=("sales.csv", SALES), purpose="user_data")
    response = client.responses.create(
        model=model,
        input=ASK,
        tools=[{"type": "code_interpreter", "container": {"type": "auto", "file_ids": [csv.id]}}],
        include=["code_interpreter_call.outputs"],
    )
    call = next(item for item in response.output if item.type == "code_interpreter_call")
    print("container:", call.container_id)
    print("logs:", "".join(o.logs for o in call.outputs or [] if o.type == "logs").strip())
    citations = [
        annotation
        for item in response.output
        if item.type == "message"
        for part in item.content
        if part.type == "output_text"
        for annotation in part.annotations
        if annotation.type == "container_file_citation"
    ]
    for citation in citations:
        if citation.filename.endswith(".png"):
            content = client.containers.files.content.retrieve(
                citation.file_id, container_id=citation.container_id
            )
            with open(out, "wb") as file:
                file.write(content.read())
            print("saved:", citation.filename, "->", out)
            return
    raise SystemExit("the answer cites no PNG")


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v1",
        sys.argv[2] if len(sys.argv) > 2 else "plot.png",
    )
