//! The exported descriptor set is what gRPC reflection serves: it must hold every service and
//! keep the .proto comments, which `grpcurl describe` shows to operators.

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
            "perago.slot.v1.Slot"
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
