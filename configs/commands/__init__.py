"""One settings file per command (`python -m experiments.<command>` reads configs/commands/<command>.py unless
--config names another), composed from the blocks of configs/common.py; --config.FIELD=VALUE overrides a field."""
