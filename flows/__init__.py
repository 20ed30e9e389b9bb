"""The Prefect flows: a round, one stage alone, iterated rounds, and the automations that chain them."""

import logging


class _RefusedParameterValuesHidden(logging.Filter):
    """Prefect logs a flow run whose parameters fail validation with pydantic's errors, each refused value in them,
    and every parameter: a key pasted into the form (api_key_env, a URL with a password) would reach the worker's
    log. The line keeps what failed, not the values; the flow run's state message names each refused key."""

    PREFIX = "Parameter validation failed for flow"

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(self.PREFIX):
            record.msg = (f"{message.split(':', 1)[0]}: the values are not shown (a refused value may be a secret); "
                          "the flow run's state message names each refused key")
            record.args = ()
        return True


logging.getLogger("prefect.flows").addFilter(_RefusedParameterValuesHidden())
