//! The exported descriptor set is what gRPC reflection serves: it must hold every service and
//! keep the .proto comments, which `grpcurl describe` shows to operators.

#![forbid(unsafe_code)]

use prost::Message as _;
use prost_types::FileDescriptorSet;

fn descriptor_set() -> FileDescriptorSet {
    FileDescriptorSet::decode(perago_proto::FILE_DESCRIPTOR_SET).expect("descriptor set decodes")
}

#[test]
fn every_service_is_described() {
    let set = descriptor_set();
    let mut services: Vec<String> = set
        .file
        .iter()
        .flat_map(|f| {
            let package = f.package().to_owned();
            f.service
                .iter()
                .map(move |s| format!("{package}.{}", s.name()))
        })
        .collect();
    services.sort();
    assert_eq!(
        services,
        [
            "perago.admin.v1.Admin",
            "perago.slot.v1.Control",
            "perago.slot.v1.Slot",
            "perago.supervisor.v1.Supervisor"
        ]
    );
}

#[test]
fn comments_survive_for_reflection() {
    let set = descriptor_set();
    let slot = set
        .file
        .iter()
        .find(|f| f.name() == "perago/slot/v1/slot.proto")
        .expect("slot.proto is in the set");
    let info = slot.source_code_info.as_ref().expect("source info kept");
    let comments: Vec<&str> = info
        .location
        .iter()
        .filter_map(|l| l.leading_comments.as_deref())
        .collect();
    assert!(
        comments
            .iter()
            .any(|c| c.contains("The attempt fence: the broker reads the task back")),
        "ReloadAttempt's comment is missing from the descriptor"
    );
}

#[test]
fn every_message_and_field_is_commented() {
    // The .proto files are the protocol reference for grpcurl users: an uncommented message
    // or field is a documentation bug.
    for file in descriptor_set().file {
        let info = file.source_code_info.clone().expect("source info kept");
        let commented = |path: &[i32]| {
            info.location.iter().any(|l| {
                l.path == path
                    && l.leading_comments
                        .as_deref()
                        .is_some_and(|c| !c.trim().is_empty())
            })
        };
        // 4 = message_type, 2 = field (descriptor.proto field numbers).
        for (m, message) in file.message_type.iter().enumerate() {
            let m = m as i32;
            assert!(
                commented(&[4, m]),
                "{}: message {} has no comment",
                file.name(),
                message.name()
            );
            for (f, field) in message.field.iter().enumerate() {
                assert!(
                    commented(&[4, m, 2, f as i32]),
                    "{}: field {}.{} has no comment",
                    file.name(),
                    message.name(),
                    field.name()
                );
            }
        }
    }
}

#[test]
fn the_admin_service_has_its_methods_with_comments() {
    let set = descriptor_set();
    let admin = set
        .file
        .iter()
        .find(|f| f.name() == "perago/admin/v1/admin.proto")
        .expect("admin.proto is in the set");
    let service = &admin.service[0];
    let methods: Vec<(&str, &str, &str)> = service
        .method
        .iter()
        .map(|m| (m.name(), m.input_type(), m.output_type()))
        .collect();
    assert_eq!(
        methods,
        [
            (
                "Status",
                ".perago.admin.v1.StatusRequest",
                ".perago.admin.v1.StatusResponse"
            ),
            (
                "Drain",
                ".perago.admin.v1.DrainRequest",
                ".perago.admin.v1.DrainResponse"
            ),
            (
                "Metrics",
                ".perago.admin.v1.MetricsRequest",
                ".perago.admin.v1.MetricsResponse"
            ),
            (
                "Watch",
                ".perago.admin.v1.WatchRequest",
                ".perago.admin.v1.StatusResponse"
            ),
            (
                "Pause",
                ".perago.admin.v1.PauseRequest",
                ".perago.admin.v1.PauseResponse"
            ),
            (
                "Resume",
                ".perago.admin.v1.ResumeRequest",
                ".perago.admin.v1.ResumeResponse"
            ),
            (
                "Scale",
                ".perago.admin.v1.ScaleRequest",
                ".perago.admin.v1.ScaleResponse"
            ),
            (
                "Reconfigure",
                ".perago.admin.v1.ReconfigureRequest",
                ".perago.admin.v1.ReconfigureResponse"
            ),
            (
                "ShareGrant",
                ".perago.admin.v1.ShareGrantRequest",
                ".perago.admin.v1.ShareStatus"
            ),
        ]
    );
    // Watch is the one stream: the broker pushes, the request is one message.
    let streaming: Vec<(&str, bool, bool)> = service
        .method
        .iter()
        .map(|m| (m.name(), m.client_streaming(), m.server_streaming()))
        .collect();
    assert_eq!(
        streaming,
        [
            ("Status", false, false),
            ("Drain", false, false),
            ("Metrics", false, false),
            ("Watch", false, true),
            ("Pause", false, false),
            ("Resume", false, false),
            ("Scale", false, false),
            ("Reconfigure", false, false),
            ("ShareGrant", false, false),
        ]
    );
    // 6 = service, 2 = method (descriptor.proto field numbers).
    let info = admin.source_code_info.as_ref().expect("source info kept");
    for m in 0..methods.len() as i32 {
        assert!(
            info.location.iter().any(|l| l.path == [6, 0, 2, m]
                && l.leading_comments
                    .as_deref()
                    .is_some_and(|c| !c.trim().is_empty())),
            "Admin method {} has no comment",
            methods[m as usize].0
        );
    }
    let response = admin
        .message_type
        .iter()
        .find(|m| m.name() == "MetricsResponse")
        .expect("MetricsResponse");
    let fields: Vec<(&str, i32)> = response
        .field
        .iter()
        .map(|f| (f.name(), f.number()))
        .collect();
    assert_eq!(fields, [("text", 1), ("content_type", 2)]);
}

#[test]
fn slot_exited_answers_the_brokers_view_of_the_slot() {
    let set = descriptor_set();
    let slot = set
        .file
        .iter()
        .find(|f| f.name() == "perago/slot/v1/slot.proto")
        .expect("slot.proto is in the set");
    let control = slot
        .service
        .iter()
        .find(|s| s.name() == "Control")
        .expect("Control");
    let exited = control
        .method
        .iter()
        .find(|m| m.name() == "SlotExited")
        .expect("SlotExited");
    assert_eq!(exited.output_type(), ".perago.slot.v1.SlotExitedAck");
    let ack = slot
        .message_type
        .iter()
        .find(|m| m.name() == "SlotExitedAck")
        .expect("SlotExitedAck");
    let fields: Vec<(&str, i32)> = ack.field.iter().map(|f| (f.name(), f.number())).collect();
    assert_eq!(fields, [("draining", 1), ("retired", 2), ("recycling", 3)]);
}

#[test]
fn a_slot_status_phase_reads_back_as_the_enum() {
    use perago_proto::{admin::v1::SlotStatus, slot::v1::Phase};
    for phase in [
        Phase::Idle,
        Phase::Preparing,
        Phase::Downloading,
        Phase::Body,
        Phase::Staging,
        Phase::Publishing,
        Phase::Cleanup,
        Phase::Reporting,
    ] {
        let status = SlotStatus {
            phase: phase.status_name().to_owned(),
            ..SlotStatus::default()
        };
        assert_eq!(status.phase_kind(), Some(phase), "{}", status.phase);
    }
    // Nothing reported yet reads as preparing; no assignment, or an unknown name, as none.
    assert_eq!(Phase::Unspecified.status_name(), "preparing");
    assert_eq!(Phase::Body.status_name(), "body");
    assert_eq!(Phase::from_status_name(""), None);
    assert_eq!(Phase::from_status_name("BODY"), None);
}

#[test]
fn the_external_scaler_keeps_kedas_wire_contract() {
    let set = FileDescriptorSet::decode(perago_proto::EXTERNALSCALER_DESCRIPTOR_SET)
        .expect("descriptor set decodes");
    assert_eq!(set.file.len(), 1);
    let file = &set.file[0];
    assert_eq!(file.package(), "externalscaler");
    let service = &file.service[0];
    assert_eq!(service.name(), "ExternalScaler");
    let methods: Vec<&str> = service.method.iter().map(|m| m.name()).collect();
    assert_eq!(
        methods,
        [
            "IsActive",
            "StreamIsActive",
            "GetMetricSpec",
            "GetMetrics",
            "StreamMetricSpec"
        ]
    );
    let fields = |message: &str| -> Vec<(String, i32)> {
        file.message_type
            .iter()
            .find(|m| m.name() == message)
            .unwrap_or_else(|| panic!("{message} is missing"))
            .field
            .iter()
            .map(|f| (f.name().to_owned(), f.number()))
            .collect()
    };
    let named = |pairs: &[(&str, i32)]| -> Vec<(String, i32)> {
        pairs.iter().map(|(n, i)| ((*n).to_owned(), *i)).collect()
    };
    assert_eq!(
        fields("ScaledObjectRef"),
        named(&[("name", 1), ("namespace", 2), ("scalerMetadata", 3)])
    );
    assert_eq!(fields("IsActiveResponse"), named(&[("result", 1)]));
    assert_eq!(
        fields("GetMetricSpecResponse"),
        named(&[("metricSpecs", 1)])
    );
    assert_eq!(
        fields("MetricSpec"),
        named(&[("metricName", 1), ("targetSize", 2), ("targetSizeFloat", 3)])
    );
    assert_eq!(
        fields("GetMetricsRequest"),
        named(&[("scaledObjectRef", 1), ("metricName", 2)])
    );
    assert_eq!(fields("GetMetricsResponse"), named(&[("metricValues", 1)]));
    assert_eq!(
        fields("MetricValue"),
        named(&[
            ("metricName", 1),
            ("metricValue", 2),
            ("metricValueFloat", 3)
        ])
    );
}
