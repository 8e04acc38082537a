"""The inventory: hosts, containers and defaults from inventory.yaml, validated (model.py), errors naming the
file, line and field (yaml_lines.py)."""
