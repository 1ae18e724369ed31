"""The retention audit: a Spark application that checks what retention and compaction really
deliver on any Kafka cluster (`gregor audit retention`, ADR 0026)."""
