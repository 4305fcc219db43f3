"""The store a stateful call reads: responses, conversations, files, batches, and this process's background
runs."""

from dataclasses import dataclass, field

from choir.plugins.store.batches import BatchStore
from choir.plugins.store.conversations import ConversationStore
from choir.plugins.store.files import FileStore
from choir.plugins.store.responses import ResponseStore
from choir.plugins.store.runs import Runs


@dataclass
class Store:
    responses: ResponseStore
    conversations: ConversationStore
    files: FileStore
    batches: BatchStore
    runs: Runs = field(default_factory=Runs)

    def owner(self, key: bytes | None) -> str:
        return self.responses.owner(key)
