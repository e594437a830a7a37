// Users, ACLs and topics of the secured local broker (scripts/kafka.sh --secure), through
// the Admin API as the super user; run after every start, so it is idempotent:
//
//   java -cp '<lib>/*:<classes>' SecureSetup ADMIN.properties ACLS.conf SECRETS_DIR PARTITIONS TOPIC[:k=v,...]...
//
// * SCRAM-SHA-512 credentials for every SECRETS_DIR/<user>.password except admin's (that
//   one is made by `kafka-storage format --add-scram`, before the broker can authenticate
//   anyone); upserted, so a changed password file takes effect on the next start;
// * the ACLs of ACLS.conf, exactly: missing bindings are created, bindings not in the file
//   are deleted;
// * the topics, created when missing (an existing topic is left as it is).
//
// kafka_2.13 4.x ships no kafka-acls tool class (AclCommand moved to the kafka-tools
// artifact), and aiokafka's admin client has no ACL or SCRAM calls: hence this file.
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class SecureSetup {
    static final long TIMEOUT_S = 30;

    public static void main(String[] args) {
        if (args.length < 4) {
            System.err.println("usage: SecureSetup ADMIN.properties ACLS.conf SECRETS_DIR PARTITIONS TOPIC[:k=v,...]...");
            System.exit(2);
        }
        try {
            run(args);
        } catch (SetupError e) {
            System.err.println("secure setup: " + e.getMessage());
            System.exit(1);
        } catch (Exception e) {
            StringBuilder message = new StringBuilder("secure setup: " + e);
            for (Throwable cause = e.getCause(); cause != null; cause = cause.getCause()) {
                message.append(": ").append(cause);
            }
            System.err.println(message);
            System.exit(1);
        }
    }

    static final class SetupError extends Exception {
        SetupError(String message) {
            super(message);
        }
    }

    static void run(String[] args) throws Exception {
        Properties props = new Properties();
        try (var in = Files.newInputStream(Path.of(args[0]))) {
            props.load(in);
        }
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "20000");
        Set<AclBinding> wanted = parseAcls(Path.of(args[1]));
        Map<String, String> passwords = readPasswords(Path.of(args[2]));
        int partitions = Integer.parseInt(args[3]);
        List<NewTopic> topics = new ArrayList<>();
        for (int i = 4; i < args.length; i++) {
            topics.add(parseTopic(args[i], partitions));
        }

        try (Admin admin = Admin.create(props)) {
            List<UserScramCredentialAlteration> users = new ArrayList<>();
            for (var entry : passwords.entrySet()) {
                users.add(new UserScramCredentialUpsertion(
                        entry.getKey(), new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), entry.getValue()));
            }
            if (!users.isEmpty()) {
                admin.alterUserScramCredentials(users).all().get(TIMEOUT_S, TimeUnit.SECONDS);
            }

            Set<AclBinding> have = new HashSet<>(admin.describeAcls(AclBindingFilter.ANY).values().get(TIMEOUT_S, TimeUnit.SECONDS));
            List<AclBinding> stale = have.stream().filter(b -> !wanted.contains(b)).toList();
            List<AclBinding> missing = wanted.stream().filter(b -> !have.contains(b)).toList();
            if (!stale.isEmpty()) {
                admin.deleteAcls(stale.stream().map(AclBinding::toFilter).toList()).all().get(TIMEOUT_S, TimeUnit.SECONDS);
            }
            if (!missing.isEmpty()) {
                admin.createAcls(missing).all().get(TIMEOUT_S, TimeUnit.SECONDS);
            }

            List<String> created = new ArrayList<>();
            Map<String, KafkaFuture<Void>> results = topics.isEmpty() ? Map.of() : admin.createTopics(topics).values();
            for (var entry : results.entrySet()) {
                try {
                    entry.getValue().get(TIMEOUT_S, TimeUnit.SECONDS);
                    created.add(entry.getKey());
                } catch (ExecutionException e) {
                    if (!(e.getCause() instanceof TopicExistsException)) {
                        throw e;
                    }
                }
            }
            System.out.printf("users %s; %d ACLs (%d added, %d removed); topics created: %s%n",
                    new TreeSet<>(passwords.keySet()), wanted.size(), missing.size(), stale.size(),
                    created.isEmpty() ? "none" : String.join(", ", created));
        }
    }

    /** Every SECRETS_DIR/<user>.password but admin's, user -> password (first line). */
    static Map<String, String> readPasswords(Path dir) throws Exception {
        Map<String, String> out = new HashMap<>();
        try (Stream<Path> files = Files.list(dir)) {
            for (Path file : files.toList()) {
                String name = file.getFileName().toString();
                if (!name.endsWith(".password") || name.equals("admin.password")) {
                    continue;
                }
                String password = Files.readString(file, StandardCharsets.UTF_8).strip();
                if (password.isEmpty()) {
                    throw new SetupError(file + " is empty");
                }
                out.put(name.substring(0, name.length() - ".password".length()), password);
            }
        }
        return out;
    }

    /** Lines "principal resource pattern name Op1,Op2" (see secure-acls.conf). */
    static Set<AclBinding> parseAcls(Path file) throws Exception {
        Set<AclBinding> out = new HashSet<>();
        int n = 0;
        for (String raw : Files.readAllLines(file, StandardCharsets.UTF_8)) {
            n++;
            String line = raw.strip();
            if (line.isEmpty() || line.startsWith("#")) {
                continue;
            }
            String[] f = line.split("\\s+");
            if (f.length != 5) {
                throw new SetupError(file + ":" + n + ": expected 5 columns, got " + f.length);
            }
            ResourceType type = ResourceType.fromString(f[1].toUpperCase(Locale.ROOT));
            PatternType pattern = PatternType.fromString(f[2].toUpperCase(Locale.ROOT));
            if (type == ResourceType.UNKNOWN || pattern == PatternType.UNKNOWN || !f[0].startsWith("User:")) {
                throw new SetupError(file + ":" + n + ": bad principal, resource or pattern type: " + line);
            }
            for (String op : f[4].split(",")) {
                AclOperation operation = AclOperation.fromString(op.replaceAll("([a-z])([A-Z])", "$1_$2").toUpperCase(Locale.ROOT));
                if (operation == AclOperation.UNKNOWN) {
                    throw new SetupError(file + ":" + n + ": unknown operation " + op);
                }
                out.add(new AclBinding(new ResourcePattern(type, f[3], pattern),
                        new AccessControlEntry(f[0], "*", operation, AclPermissionType.ALLOW)));
            }
        }
        return out;
    }

    /** "name" or "name:key=value,key=value". */
    static NewTopic parseTopic(String spec, int partitions) {
        String[] parts = spec.split(":", 2);
        NewTopic topic = new NewTopic(parts[0], partitions, (short) 1);
        if (parts.length == 2) {
            Map<String, String> configs = new HashMap<>();
            for (String kv : parts[1].split(",")) {
                String[] pair = kv.split("=", 2);
                configs.put(pair[0], pair[1]);
            }
            topic.configs(configs);
        }
        return topic;
    }
}
