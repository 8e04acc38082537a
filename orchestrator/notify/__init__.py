"""Notifications: the watch's alerts sent through apprise (ntfy, Slack, Discord, Telegram, Matrix, e-mail,
JSON webhooks...), and the screenless watcher (`watch --headless`) that prints them as JSON lines.

kinds.py names what a destination can ask for; destinations.py turns the inventory's `notify:` and `--notify`
into apprise senders; policy.py decides what is sent (kinds, repeats collapsed, recoveries); sender.py sends
on one thread per destination; pump.py reads the live source's alert feed; headless.py is the screenless loop.
"""
