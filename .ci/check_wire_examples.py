"""Validates the wire-format examples against the JSON Schema, and checks the schema rejects a broken ack."""
import json
import pathlib
import sys

import jsonschema

wire = pathlib.Path(__file__).resolve().parent.parent / "Sources/StrataSync/Wire"
schema = json.loads((wire / "strata-wire.schema.json").read_text())
for kind in ("delta", "batch", "ack"):
    document = json.loads((wire / "examples" / f"{kind}.json").read_text())
    jsonschema.validate(document, {**schema, "oneOf": [{"$ref": f"#/$defs/{kind}"}]})
broken = json.loads((wire / "examples" / "ack.json").read_text())
broken["results"][2].pop("error")
try:
    jsonschema.validate(broken, schema)
except jsonschema.ValidationError:
    print("wire examples: valid; a refused row without an error is rejected")
    sys.exit(0)
sys.exit("the schema accepted a refused row without an error")
