"""The runtime classpath of Apache Kafka 3.9.1 (KRaft broker + controller), pinned jar by jar.

What Maven resolved for ``org.apache.kafka:kafka_2.13:3.9.1`` plus the ``slf4j-reload4j`` binding
the official distribution ships (runtime scope, 57 jars, 46 MB), with the SHA-256 of each file as
Maven Central serves it. :mod:`app.servers.kafka_libs` downloads and verifies exactly these.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KAFKA_RUNTIME_JARS", "KAFKA_VERSION", "MavenJar"]

KAFKA_VERSION = "3.9.1"


@dataclass(frozen=True, slots=True)
class MavenJar:
    """One jar by its Maven coordinates and the SHA-256 its bytes must have."""

    group: str
    artifact: str
    version: str
    sha256: str

    @property
    def filename(self) -> str:
        """``artifact-version.jar``, the name Maven gives the file (unique on this classpath)."""
        return f"{self.artifact}-{self.version}.jar"

    def url(self, repository: str) -> str:
        """Where ``repository`` (a Maven 2 layout base URL) serves the jar."""
        path = "/".join([*self.group.split("."), self.artifact, self.version, self.filename])
        return f"{repository.rstrip('/')}/{path}"


KAFKA_RUNTIME_JARS: tuple[MavenJar, ...] = (
    MavenJar(
        "net.sourceforge.argparse4j",
        "argparse4j",
        "0.7.0",
        "65ceb669d88f63306c680f8088bbf765bbca72d288a61a03703000076c3d3f56",
    ),
    MavenJar(
        "org.apache.yetus",
        "audience-annotations",
        "0.12.0",
        "ffb101fc066360ff3c77457c927fd7967fb096a6ee9e046ab7071447d8208efc",
    ),
    MavenJar(
        "com.github.ben-manes.caffeine",
        "caffeine",
        "2.9.3",
        "1e0a7bbef1dd791653143f3f05d0e489934bf5481e58a87c9e619cd46b68729b",
    ),
    MavenJar(
        "commons-beanutils",
        "commons-beanutils",
        "1.9.4",
        "7d938c81789028045c08c065e94be75fc280527620d5bd62b519d5838532368a",
    ),
    MavenJar(
        "commons-cli",
        "commons-cli",
        "1.4",
        "fd3c7c9545a9cdb2051d1f9155c4f76b1e4ac5a57304404a6eedb578ffba7328",
    ),
    MavenJar(
        "commons-collections",
        "commons-collections",
        "3.2.2",
        "eeeae917917144a68a741d4c0dff66aa5c5c5fd85593ff217bced3fc8ca783b8",
    ),
    MavenJar(
        "commons-digester",
        "commons-digester",
        "2.1",
        "e0b2b980a84fc6533c5ce291f1917b32c507f62bcad64198fff44368c2196a3d",
    ),
    MavenJar(
        "commons-io",
        "commons-io",
        "2.14.0",
        "e35d1df7232568ed4b81d9a9ed94a0159b3ff6cf1915cc21eef5cb55d7b157a2",
    ),
    MavenJar(
        "commons-logging",
        "commons-logging",
        "1.2",
        "daddea1ea0be0f56978ab3006b8ac92834afeefbd9b7e4e6316fca57df0fa636",
    ),
    MavenJar(
        "commons-validator",
        "commons-validator",
        "1.7",
        "4d74f4ce4fb68b2617edad086df6defdf9338467d2377d2c62e69038e1c4f02f",
    ),
    MavenJar(
        "com.google.errorprone",
        "error_prone_annotations",
        "2.10.0",
        "a249d4d25dfb86d41e6c82fc335df580189f0c9feeabdc53233fc1e5060724a1",
    ),
    MavenJar(
        "com.fasterxml.jackson.core",
        "jackson-annotations",
        "2.16.2",
        "d1cdd269ebaa753d1842933194e17d61958f058952d63e03dbfb3d1d78a6926e",
    ),
    MavenJar(
        "com.fasterxml.jackson.core",
        "jackson-core",
        "2.16.2",
        "4f43e2f1430b2d2413e8e5a3d79138e57e891d6a961b18c28ac90859639d8664",
    ),
    MavenJar(
        "com.fasterxml.jackson.core",
        "jackson-databind",
        "2.16.2",
        "53b6025d98c357068296e4b134242443a248c2c582800879f1c4ea93b54bafa6",
    ),
    MavenJar(
        "com.fasterxml.jackson.dataformat",
        "jackson-dataformat-csv",
        "2.16.2",
        "01a04610def154c50369e8bcd7c5ae1401579f591aa55e88f05093447e24d490",
    ),
    MavenJar(
        "com.fasterxml.jackson.datatype",
        "jackson-datatype-jdk8",
        "2.16.2",
        "3e9b1b59f638b487b5ae0e2f4190fc98f72b0bf661324e7dfc71a69f6b9d4e29",
    ),
    MavenJar(
        "com.fasterxml.jackson.module",
        "jackson-module-scala_2.13",
        "2.16.2",
        "1154f6dc8643739c0c3ef4c2a7901ca752b5cca7ebe1908d405ced701a8f3764",
    ),
    MavenJar(
        "net.sf.jopt-simple",
        "jopt-simple",
        "5.0.4",
        "df26cc58f235f477db07f753ba5a3ab243ebe5789d9f89ecf68dd62ea9a66c28",
    ),
    MavenJar(
        "org.bitbucket.b_c",
        "jose4j",
        "0.9.4",
        "9012aa4c20319d35159030c3bdecade66863030a98338bfdf73a5238849fb9d9",
    ),
    MavenJar(
        "org.apache.kafka",
        "kafka-clients",
        "3.9.1",
        "7568b998572d256f0b7bc0afdc1b7a2588b8b08415c62ce314c864a6851ae9d9",
    ),
    MavenJar(
        "org.apache.kafka",
        "kafka-group-coordinator",
        "3.9.1",
        "fd30310533df51b17d14beb8eb8c9006a9ebb90b536c319776429e413f622a69",
    ),
    MavenJar(
        "org.apache.kafka",
        "kafka-group-coordinator-api",
        "3.9.1",
        "cb267d841def1172d8db24a830936f1c6aaf29c3de5bdbc5bbc42b67d8cb82c0",
    ),
    MavenJar(
        "org.apache.kafka",
        "kafka-metadata",
        "3.9.1",
        "35c35118d4abb0b747ad68d1e0be00d5bd02206b462ad76ebbcd85b33436f13a",
    ),
    MavenJar(
        "org.apache.kafka",
        "kafka-raft",
        "3.9.1",
        "0d4236cf868f8668c74c49bec4bed41e400bb13d6d381a0f8e9843585b2f159f",
    ),
    MavenJar(
        "org.apache.kafka",
        "kafka-server",
        "3.9.1",
        "02b5a92645865e3152e9d1d829f6d4c4b4272f637b7fe4a2b00cabcbcd8df6f4",
    ),
    MavenJar(
        "org.apache.kafka",
        "kafka-server-common",
        "3.9.1",
        "99f1f5f81e9d39cfbe5c96ab8e3854be8deca465937192c9a6e2f231678d31f6",
    ),
    MavenJar(
        "org.apache.kafka",
        "kafka-storage",
        "3.9.1",
        "a3041e6192a37e5508519d776f8af93b74d3fd23174b03e270c0394f1c77b59f",
    ),
    MavenJar(
        "org.apache.kafka",
        "kafka-storage-api",
        "3.9.1",
        "f466777625641d4bca1314d80206eafa9e2494326496ad626489ba0a0ef479fc",
    ),
    MavenJar(
        "org.apache.kafka",
        "kafka-tools-api",
        "3.9.1",
        "c365c872ffc9a04886f248c5fd90067829ed4064fcd8fe5e12611b163cd053b4",
    ),
    MavenJar(
        "org.apache.kafka",
        "kafka-transaction-coordinator",
        "3.9.1",
        "45b852f2e6e501d4dbdd43b97c4057e6cb6827b76e5aabcffcae8b8e2918554f",
    ),
    MavenJar(
        "org.apache.kafka",
        "kafka_2.13",
        "3.9.1",
        "5631c61356d55611c158291a69ad028f3c4fed5d0a610c62a0853c65c89d10f6",
    ),
    MavenJar(
        "org.lz4", "lz4-java", "1.8.0", "d74a3334fb35195009b338a951f918203d6bbca3d1d359033dc33edd1cadc9ef"
    ),
    MavenJar(
        "com.yammer.metrics",
        "metrics-core",
        "2.2.0",
        "6b7a14a6f34c10f8683f7b5e2f39df0f07b58c7dff0e468ebbc713905c46979c",
    ),
    MavenJar(
        "io.dropwizard.metrics",
        "metrics-core",
        "4.1.12.1",
        "cec34936faa625039f4e46123eccaa10a9eb9d9a40c6075830cd81330e259cf9",
    ),
    MavenJar(
        "io.netty",
        "netty-buffer",
        "4.1.105.Final",
        "cc1b0108a60b1eb69bd01a10922851a166c58972cc0683f2116a9e8e7ecdaf0b",
    ),
    MavenJar(
        "io.netty",
        "netty-codec",
        "4.1.105.Final",
        "c4f62480b408fb835b454c74cf6394a4c7088ffdaec78742fcece816c46bb58e",
    ),
    MavenJar(
        "io.netty",
        "netty-common",
        "4.1.105.Final",
        "399a8045fb43861afb7fc1ef3371f95a0b176692fb268f4867cff4957e63fd25",
    ),
    MavenJar(
        "io.netty",
        "netty-handler",
        "4.1.105.Final",
        "5a6945cf1de374628b37ab1c35a4c47c2f5616db3a94b150720641477112be8e",
    ),
    MavenJar(
        "io.netty",
        "netty-resolver",
        "4.1.105.Final",
        "7202edd076a1edab50fdb0f3e54f56a02129b326296d9f35f4194f8cfb9b96ef",
    ),
    MavenJar(
        "io.netty",
        "netty-transport",
        "4.1.105.Final",
        "be9b8a2f86685a876e469c904cb9fce53a1e826e178d44d2b1d92f6a99054737",
    ),
    MavenJar(
        "io.netty",
        "netty-transport-classes-epoll",
        "4.1.105.Final",
        "a43bf94f784eb759c14f0b0c7e1c5985a64879e8c7ab21ba7c0c80f7a9382b30",
    ),
    MavenJar(
        "io.netty",
        "netty-transport-native-epoll",
        "4.1.105.Final",
        "61f09ce16f0fd25e57a0a732f8fb79344f6b95051d88ac50a28874ad92e6d149",
    ),
    MavenJar(
        "io.netty",
        "netty-transport-native-unix-common",
        "4.1.105.Final",
        "7db91b72aae19e1cdca13c7fa76d57db20cbaf5b1e770563909a4437c63eb5cb",
    ),
    MavenJar(
        "com.thoughtworks.paranamer",
        "paranamer",
        "2.8",
        "688cb118a6021d819138e855208c956031688be4b47a24bb615becc63acedf07",
    ),
    MavenJar(
        "org.pcollections",
        "pcollections",
        "4.0.1",
        "1f82766d7c3221930854033bebff5073ea46b43f27326074bbe15d148c18bfb3",
    ),
    MavenJar(
        "ch.qos.reload4j",
        "reload4j",
        "1.2.19",
        "fa07aa7adedf2a65eb09007443bb60b51c725b1b5b88e481e00c529ff2d3b5b5",
    ),
    MavenJar(
        "org.scala-lang.modules",
        "scala-collection-compat_2.13",
        "2.10.0",
        "bb10091bd55131a5327bdeddede74e5d8a695acab24a97567111784f2f427299",
    ),
    MavenJar(
        "org.scala-lang.modules",
        "scala-java8-compat_2.13",
        "1.0.2",
        "90d5b13656be93fb779b8d7c723efa2498a34af06273bb5204afb65f85a20c1b",
    ),
    MavenJar(
        "org.scala-lang",
        "scala-library",
        "2.13.15",
        "8e4dbc3becf70d59c787118f6ad06fab6790136a0699cd6412bc9da3d336944e",
    ),
    MavenJar(
        "com.typesafe.scala-logging",
        "scala-logging_2.13",
        "3.9.5",
        "87a3017d3f43e6ace7566fe4c3d615134c6914ff871c8d64bb32ca1d996d0545",
    ),
    MavenJar(
        "org.scala-lang",
        "scala-reflect",
        "2.13.15",
        "78d0cc350e1ee42d87c6e11cf5b0dc7bf0b70829c00aa38f27bfb019d439dc11",
    ),
    MavenJar(
        "org.slf4j", "slf4j-api", "1.7.36", "d3ef575e3e4979678dc01bf1dcce51021493b4d11fb7f1be8ad982877c16a1c0"
    ),
    MavenJar(
        "org.slf4j",
        "slf4j-reload4j",
        "1.7.36",
        "ae6fdd5c9547896114d5ec7fa7503733b7d2890573d3886fb548b3119c4d3f67",
    ),
    MavenJar(
        "org.xerial.snappy",
        "snappy-java",
        "1.1.10.5",
        "0f3f1857ed33116583f480b4df5c0218836c47bfbc9c6221c0d73f356decf37b",
    ),
    MavenJar(
        "org.apache.zookeeper",
        "zookeeper",
        "3.8.4",
        "2d77b152039e7f85dc5438a9304febff86a2f3e55c88976a8be309af39028e97",
    ),
    MavenJar(
        "org.apache.zookeeper",
        "zookeeper-jute",
        "3.8.4",
        "93e854b55d731e745bafec187e2e7bf3389fd2a88e2fc8d1a3c1b9110284b284",
    ),
    MavenJar(
        "com.github.luben",
        "zstd-jni",
        "1.5.6-4",
        "793ca8734aa15687e7e64564eab8b6ae9ee2720eae27aa663074682144b1c386",
    ),
)
