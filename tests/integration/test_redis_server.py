import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from corl.redis_server import LocalRedis

# A refused client fails at once: redis-py's default retries an AuthenticationError (a ConnectionError)
# with backoff, about 3.6 s a call here.
NO_RETRY = Retry(NoBackoff(), 0)


def test_local_redis_is_real_and_stops() -> None:
    with LocalRedis() as srv:
        r = redis.Redis.from_url(srv.url)
        r.xadd("s", {"a": "1"})
        assert r.xlen("s") == 1
        port = srv.port
        # A stranger without the password can neither read nor forge a batch.
        stranger = redis.Redis(port=port, socket_connect_timeout=0.5, retry=NO_RETRY)
        for call in (stranger.ping, lambda: stranger.xadd("corl:run:batches:m", {"batch": "{}"})):
            try:
                call()
                raise AssertionError("redis answered a client without the password")
            except redis.AuthenticationError:
                pass
        assert srv.url.startswith("redis://:") and "password" in {p.name for p in srv.data_dir.iterdir()}
    try:
        redis.Redis(port=port, socket_connect_timeout=0.5, retry=NO_RETRY).ping()
        raise AssertionError("redis still answering after close")
    except redis.ConnectionError:
        pass
