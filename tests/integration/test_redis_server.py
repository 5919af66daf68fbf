import redis

from corl.redis_server import LocalRedis


def test_local_redis_is_real_and_stops() -> None:
    with LocalRedis() as srv:
        r = redis.Redis.from_url(srv.url)
        r.xadd("s", {"a": "1"})
        assert r.xlen("s") == 1
        port = srv.port
    try:
        redis.Redis(port=port, socket_connect_timeout=0.5).ping()
        raise AssertionError("redis still answering after close")
    except redis.ConnectionError:
        pass
