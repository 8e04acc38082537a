"""The inventory: hosts, containers and defaults from inventory.yaml (model.py), validated against its schema
(schema.py), errors naming the file, line and field (yaml_lines.py)."""
