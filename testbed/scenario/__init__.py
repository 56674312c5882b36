"""The scenario file: the model, its YAML source and parser, the JSON Schema, the fault plan, the
timeout ladder.
"""
