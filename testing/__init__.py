"""The test and bench harness: servers and workers a test or a bench starts on loopback.

Not part of the product (never packaged, never imported by ``agents``, ``tables``, ``app`` or
``schemas``: ``.importlinter`` says so). It builds on the dev stack's servers (``app.servers``).

Modules:

* ``ports``               free TCP ports, drawn at random, never handed out twice in a process.
* ``processes``           start and stop servers and workers side by side.
* ``workers``             agent-group workers as processes (``avcc worker GROUP``), ready by ``/ready``.
* ``kafka_cluster``       several Kafka nodes forming one KRaft cluster.
* ``kafka_secure``        a broker with SASL_SSL listeners and the standard authorizer.
* ``tls``                 a throwaway certificate authority.
* ``clickhouse``          a ClickHouse server.
* ``clickhouse_cluster``  ClickHouse shards and replicas with their ZooKeeper.
* ``zookeeper``           ZooKeeper from the Kafka jars.
* ``ledger_node``         the chain's ledger node (``avcc chain node``) as a process.
"""
