"""The Celery application: broker from the settings, delivery options, the reconcile and
learning beats."""

from __future__ import annotations

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import sqlalchemy as table_broker

from service.settings import Settings, get_settings
from service.tasks import LEARN, RECONCILE
from workers import observe

# The embedded broker (a SQLite table) is polled: every 1 s by kombu's default, which a launch
# and an end report would each wait half of on average. Redis delivers at once (BRPOP).
TABLE_BROKER_POLL_S = 0.1


class TableBroker(table_broker.Transport):
    """kombu's SQLAlchemy transport, polled more often (its transport options all go to
    ``create_engine``, so the interval cannot be set there)."""

    polling_interval = TABLE_BROKER_POLL_S


TRANSPORT_ALIASES["sqla"] = f"{__name__}:TableBroker"  # what a sqla+ broker URL resolves to


def make_celery(settings: Settings) -> Celery:
    settings.data_dir.mkdir(parents=True, exist_ok=True)  # the embedded broker lives there
    app = Celery("zeropilot", broker=settings.broker_url, include=["workers.tasks"])
    app.conf.update(
        # Tasks are short and idempotent, so a task lost with its worker may safely run again.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        beat_schedule={
            "reconcile": {"task": RECONCILE, "schedule": settings.workers.reconcile_interval_s},
            "learn": {"task": LEARN, "schedule": settings.workers.learn_interval_s},
        },
    )
    observe.install(settings)
    return app


app = make_celery(get_settings())
