"""Every Redis key, group name and lifetime the queue uses, in one place.

Model cards and tokenizers outlive their workers, so that a model scaled to zero stays known and
its requests wait in the stream. To retire a model: DEL dcoco:model:{model}, SREM dcoco:models
{model}.

dcoco:{model}:requests        stream   request envelopes, consumed by GROUP
dcoco:{model}:workers         zset     worker id -> last heartbeat (unix ms)
dcoco:model:{model}           string   the model card (JSON), written by workers; no TTL
dcoco:tokenizer:{sha}         string   tokenizer.json of a model card, by content hash; no TTL
dcoco:worker:{id}             string   a worker's info (JSON), expires with its lease
dcoco:resp:{request}          stream   response events of one request
dcoco:wake:{gateway}          stream   wakes a gateway's blocked read of its response streams
dcoco:owner:{request}         string   "{worker} {attempt}": who may write the events
dcoco:cancel:{request}        string   set by the gateway when the client went away
dcoco:cancels                 channel  "{request} {unix seconds}", published beside each cancel flag
dcoco:limit:{key}:rate        string   per-API-key request-rate state (GCRA)
dcoco:limit:{key}:active      zset     per-API-key in-flight requests -> start (unix ms)
"""

GROUP = "workers"

RESPONSE_TTL_S = 600  # a response stream outlives its request by this much, for late readers
CANCEL_TTL_S = 600
OWNER_TTL_S = 3600  # longer than any generation; refreshed on every attempt
CONCURRENCY_LEASE_S = 3600  # an in-flight entry older than this is a leaked slot


def requests(model: str) -> str:
    return f"dcoco:{model}:requests"


def workers(model: str) -> str:
    return f"dcoco:{model}:workers"


def model_card(model: str) -> str:
    return f"dcoco:model:{model}"


MODELS = "dcoco:models"


def tokenizer(sha: str) -> str:
    return f"dcoco:tokenizer:{sha}"


def worker(worker_id: str) -> str:
    return f"dcoco:worker:{worker_id}"


def response(request_id: str) -> str:
    return f"dcoco:resp:{request_id}"


def wake(gateway_id: str) -> str:
    return f"dcoco:wake:{gateway_id}"


def owner(request_id: str) -> str:
    return f"dcoco:owner:{request_id}"


def cancel(request_id: str) -> str:
    return f"dcoco:cancel:{request_id}"


CANCELS = "dcoco:cancels"


def rate(principal: str) -> str:
    return f"dcoco:limit:{principal}:rate"


def active(principal: str) -> str:
    return f"dcoco:limit:{principal}:active"
