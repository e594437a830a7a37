// Readiness probe for scripts/kafka.sh when no Python with aiokafka is available.
// Run with the JDK's single-file source launcher against the broker classpath:
//   java -cp '<lib>/*' scripts/kafka/ReadyCheck.java 127.0.0.1:19092 [CLIENT.properties]
// (the properties file: security settings of the secured broker, see kafka.sh --secure).
// Exits 0 once describe-cluster answers with at least one broker, 1 otherwise.
// (kafka_2.13 4.x ships neither ClusterTool nor BrokerApiVersionsCommand: those live
// in the separate kafka-tools artifact.)
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeClusterResult;

public class ReadyCheck {
    public static void main(String[] args) {
        Properties p = new Properties();
        if (args.length > 1) {
            try (var in = Files.newInputStream(Path.of(args[1]))) {
                p.load(in);
            } catch (Exception e) {
                System.err.println("cannot read " + args[1] + ": " + e);
                System.exit(1);
            }
        }
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "4000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "5000");
        p.put("socket.connection.setup.timeout.max.ms", "2000");
        try (Admin admin = Admin.create(p)) {
            DescribeClusterResult r = admin.describeCluster();
            int brokers = r.nodes().get(6, TimeUnit.SECONDS).size();
            String id = r.clusterId().get(6, TimeUnit.SECONDS);
            if (brokers > 0) {
                System.out.println("cluster " + id + ": " + brokers + " broker(s)");
                System.exit(0);
            }
        } catch (Exception e) {
            System.err.println("not ready: " + e);
        }
        System.exit(1);
    }
}
