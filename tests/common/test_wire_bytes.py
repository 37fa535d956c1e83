"""`rpc.WireBytes` counts what a real server on 127.0.0.1 receives and sends, and the master
adds a shard's counts up across its relaunches."""

from elastic_keras.common import rpc
from elastic_keras.common.transfer import tensor_stream
from elastic_keras.master.membership import Membership
from elastic_keras.proto import pserver_pb2
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import PServerServicer, add_to_server


def test_a_servers_messages_are_counted_both_ways():
    wire = rpc.WireBytes()
    server, port = rpc.create_server([lambda s: add_to_server(PServerServicer(Parameters()), s)],
                                     wire_bytes=wire)
    channel = rpc.create_channel(f"127.0.0.1:{port}", "elastic_keras.PServer", deadline_s=30)
    try:
        stub = rpc.Stub(channel, tensor_stream.PSERVER)
        request = pserver_pb2.LearningRateRequest(learning_rate=0.5)
        answer = stub.LearningRate(request)
        assert wire.received == request.ByteSize()
        assert wire.sent == answer.ByteSize() > 0
        stub.LearningRate(request)
        assert wire.received == 2 * request.ByteSize()
    finally:
        channel.close()
        server.stop(0)


def test_a_relaunched_shards_bytes_add_to_its_earlier_runs():
    membership = Membership(1)
    membership.report_version(0, 1, wire_bytes=(100, 300))
    membership.report_version(0, 2, wire_bytes=(150, 400))
    membership.ps_exited(0)
    # Its replacement counts anew, and its first report may already exceed the last one.
    membership.report_version(0, 2, wire_bytes=(500, 20))
    _, shards = membership.view()
    assert (shards[0]["bytes_received"], shards[0]["bytes_sent"]) == (650, 420)
    membership.ps_exited(0)  # an exit handled twice adds nothing the second time
    membership.ps_exited(0)
    _, shards = membership.view()
    assert (shards[0]["bytes_received"], shards[0]["bytes_sent"]) == (650, 420)
